//! What a session uses of its gate: the gate's configuration and the small handles the
//! gate assembles (the bus connection, the sessions registry, presence, schemas, the
//! in-flight budget), each owning its state. A test builds one without a server: a
//! bus that is never connected to one, and the session over an in-memory stream.

use std::sync::Arc;

use bus::Bus;
use metrics::Counter;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_util::sync::CancellationToken;

use crate::asks::Asks;
use crate::auth::TokenCheck;
use crate::bus_target::Target;
use crate::config::{GateConfig, WS_WRITE_BUFFER};
use crate::labels::RouteLabels;
use crate::limits::{Held, InFlight};
use crate::presence::Presence;
use crate::schema::Schemas;
use crate::sessions::Sessions;
use crate::upgrade::{Origins, UpgradePolicy};

pub(crate) struct Context {
    pub config: GateConfig,
    pub bus: Arc<Bus<Target>>,
    pub sessions: Arc<Sessions>,
    pub presence: Arc<Presence>,
    /// The gate's own requests over the bus.
    pub asks: Arc<Asks>,
    /// Message types the workers announced, for JSON sessions' typed bodies.
    pub schemas: Arc<Schemas>,
    /// Requests of all sessions awaiting workers, against `max_gate_in_flight`.
    pub in_flight: InFlight,
    /// Requests of all sessions waiting for the bus connection to come back.
    pub held: Held,
    /// The routes the request metrics name (bounded: a client picks the route).
    pub route_labels: RouteLabels,
    pub token_check: Arc<dyn TokenCheck>,
    /// What a new connection's HTTP request may be and ask for.
    pub upgrade: UpgradePolicy,
    pub ws_config: WebSocketConfig,
    /// Cancelled when the gate starts shutting down: sessions drain and close.
    pub draining: CancellationToken,
    pub rejected: Rejected,
}

impl Context {
    /// The context of gate `config` on `bus`.
    pub(crate) fn new(
        config: GateConfig,
        bus: Arc<Bus<Target>>,
        schemas: Arc<Schemas>,
        token_check: Arc<dyn TokenCheck>,
    ) -> Self {
        let sessions = Arc::new(Sessions::default());
        let asks = Arc::new(Asks::new(&config, bus.clone()));
        let presence = Arc::new(Presence::new(
            &config,
            bus.clone(),
            sessions.clone(),
            asks.clone(),
        ));
        let ws_config = WebSocketConfig::default()
            .read_buffer_size(config.ws_buffer)
            .write_buffer_size(WS_WRITE_BUFFER)
            .max_write_buffer_size(WS_WRITE_BUFFER + 2 * config.max_frame)
            .max_frame_size(Some(config.max_frame))
            .max_message_size(Some(config.max_frame));
        let upgrade = UpgradePolicy {
            timeout: config.upgrade_timeout,
            max_bytes: config.max_upgrade_bytes,
            pages: !config.no_web,
            origins: Origins::from_list(&config.allowed_origins),
        };
        let in_flight = InFlight::new(
            config.max_gate_in_flight,
            config.gate_reserve,
            config.light_in_flight,
        );
        let held = Held::new(config.max_held, config.max_held_bytes);
        Context {
            config,
            bus,
            sessions,
            presence,
            asks,
            schemas,
            in_flight,
            held,
            route_labels: RouteLabels::default(),
            token_check,
            upgrade,
            ws_config,
            draining: CancellationToken::new(),
            rejected: Rejected::new(),
        }
    }
}

/// `gate_rejected_total` for the refusals a request can meet, registered once: a gate
/// shedding load counts one per request, and a registry lookup each time would add to
/// the load it sheds.
pub(crate) struct Rejected {
    pub route: Counter,
    pub duplicate_id: Counter,
    pub in_flight: Counter,
    pub rate: Counter,
    pub gate_in_flight: Counter,
    pub bus: Counter,
    pub bus_backlog: Counter,
    pub body: Counter,
    pub draining: Counter,
}

impl Rejected {
    fn new() -> Self {
        let reason =
            |reason: &'static str| metrics::counter!("gate_rejected_total", "reason" => reason);
        Rejected {
            route: reason("route"),
            duplicate_id: reason("duplicate_id"),
            in_flight: reason("in_flight"),
            rate: reason("rate"),
            gate_in_flight: reason("gate_in_flight"),
            bus: reason("bus"),
            bus_backlog: reason("bus_backlog"),
            body: reason("body"),
            draining: reason("draining"),
        }
    }
}
