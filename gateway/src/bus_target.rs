//! What the gate's subscriptions on its [bus connection](bus) are for: the target each
//! message read is handed to its sessions by.

use std::sync::Arc;

/// What a subscription's messages are for.
#[derive(Debug, Clone)]
pub(crate) enum Target {
    /// `<prefix>.gw.<gate>.>`: replies to this gate's requests (the bus's first
    /// subscription).
    Replies,
    /// `<prefix>.grp.<g>`: broadcasts to the group's local members.
    Group(Arc<str>),
    /// `<prefix>.user.<u>`: commands for the session bound to the player here.
    User(Arc<str>),
    /// Workers' schema announcements.
    Schemas,
    /// `<prefix>.resume.<gate>`: other gates asking for this gate's sessions.
    Resume,
}
