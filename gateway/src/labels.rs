//! The route labels of the gate's request metrics. Every distinct label is a series the
//! recorder keeps for the life of the process, and a route is the client's to choose:
//! a 404 is labelled `unknown`, but a made-up method of a service whose workers are
//! down (503) or slow (408) is not a 404. So the gate labels at most
//! [`MAX_ROUTE_LABELS`] distinct routes; later ones share the label `other`.

use std::sync::Arc;

use dashmap::DashSet;

/// Distinct routes the gate's metrics name, for the life of the process. A game has
/// tens of routes, hundreds at most.
const MAX_ROUTE_LABELS: usize = 1024;

/// The label shared by routes past [`MAX_ROUTE_LABELS`].
const OTHER: &str = "other";

/// The routes labelled so far, at most `max`.
#[derive(Debug)]
pub(crate) struct RouteLabels {
    seen: DashSet<Arc<str>>,
    max: usize,
}

impl Default for RouteLabels {
    fn default() -> Self {
        RouteLabels::new(MAX_ROUTE_LABELS)
    }
}

impl RouteLabels {
    fn new(max: usize) -> Self {
        RouteLabels {
            seen: DashSet::new(),
            max,
        }
    }

    /// The label for `route`: itself while fewer than the most routes are labelled (or
    /// it is one of them), else [`OTHER`]. Two sessions labelling new routes at once may
    /// take the set a route or two past its most: a bound, not an exact count.
    pub(crate) fn label(&self, route: &str) -> String {
        if self.seen.contains(route) {
            return route.to_owned();
        }
        if self.seen.len() >= self.max {
            return OTHER.to_owned();
        }
        self.seen.insert(route.into());
        route.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_past_the_bound_share_one_label() {
        let labels = RouteLabels::new(2);
        assert_eq!(labels.label("echo.raw"), "echo.raw");
        assert_eq!(labels.label("chat.say"), "chat.say");
        assert_eq!(labels.label("chat.x1"), OTHER);
        assert_eq!(labels.label("chat.x2"), OTHER);
        // Those labelled keep their label.
        assert_eq!(labels.label("echo.raw"), "echo.raw");
        assert_eq!(labels.seen.len(), 2);
    }
}
