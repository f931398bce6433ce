//! Route validation. A route becomes part of a NATS subject, so only
//! `service.method` with lowercase `[a-z0-9_-]` tokens passes: no wildcard, space or
//! extra dot can change what the subject means.

use nats_wire::subject::is_valid_token;

use crate::config::MAX_ROUTE_LEN;

/// Why a route was refused; the text goes back to the client with a 400.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    #[error("route is empty or longer than {MAX_ROUTE_LEN} bytes")]
    Length,
    #[error("route must be service.method")]
    Shape,
    #[error("route tokens may hold only a-z, 0-9, '_' and '-'")]
    Character,
}

/// Splits a valid route into (service, method).
pub fn parse(route: &str) -> Result<(&str, &str), RouteError> {
    if route.is_empty() || route.len() > MAX_ROUTE_LEN {
        return Err(RouteError::Length);
    }
    let (service, method) = route.split_once('.').ok_or(RouteError::Shape)?;
    if service.is_empty() || method.is_empty() || method.contains('.') {
        return Err(RouteError::Shape);
    }
    check_token(service)?;
    check_token(method)?;
    Ok((service, method))
}

/// Checks one subject token of ours (route part, gate id, prefix, group, uid) by the
/// one rule for such names ([`nats_wire::subject::is_valid_token`]).
pub fn check_token(token: &str) -> Result<(), RouteError> {
    match token {
        "" => Err(RouteError::Shape),
        _ if !is_valid_token(token) => Err(RouteError::Character),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_service_dot_method() {
        assert_eq!(parse("chat.send_msg"), Ok(("chat", "send_msg")));
        assert_eq!(parse("echo-2.x9"), Ok(("echo-2", "x9")));
    }

    #[test]
    fn refuses_anything_that_changes_the_subject() {
        for (route, err) in [
            ("", RouteError::Length),
            ("echo", RouteError::Shape),
            ("echo.", RouteError::Shape),
            (".echo", RouteError::Shape),
            ("a.b.c", RouteError::Shape),
            ("echo.*", RouteError::Character),
            ("echo.>", RouteError::Character),
            ("echo.a b", RouteError::Character),
            ("Echo.echo", RouteError::Character),
            ("echo.\u{e9}", RouteError::Character),
        ] {
            assert_eq!(parse(route), Err(err), "{route:?}");
        }
        assert_eq!(
            parse(&format!("a.{}", "b".repeat(MAX_ROUTE_LEN))),
            Err(RouteError::Length)
        );
    }
}
