//! Which connections the gate takes: at most `max_sessions` at once and at most
//! `max_connections_per_ip` from one address, counted from accept to close — a
//! connection still in its upgrade or handshake holds a descriptor as surely as a
//! session does, so it counts the same.
//!
//! A refused connection is answered with a one-line HTTP status and closed by the
//! accept loop itself, without a task: refusing must cost less than serving.

use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use rustc_hash::FxHashMap;

/// Why a connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The gate holds `max_sessions` connections.
    Full,
    /// This address holds `max_connections_per_ip` connections.
    PerIp,
}

impl Refusal {
    /// The `reason` label of `gate_rejected_total`.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::Full => "sessions",
            Refusal::PerIp => "per_ip",
        }
    }

    /// What the client reads before the close: its WebSocket library reports the status.
    pub fn response(self) -> &'static [u8] {
        match self {
            Refusal::Full => {
                b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            }
            Refusal::PerIp => {
                b"HTTP/1.1 429 Too Many Requests\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            }
        }
    }
}

#[derive(Default)]
struct Counts {
    total: usize,
    /// Only addresses with a connection open: the map is bounded by the connections.
    per_ip: FxHashMap<IpAddr, usize>,
}

/// The connection counts of one gate. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Admission {
    counts: Arc<Mutex<Counts>>,
    max_total: usize,
    /// 0: no limit.
    max_per_ip: usize,
}

/// One admitted connection; dropping it gives its place back.
pub(crate) struct Ticket {
    admission: Admission,
    ip: IpAddr,
}

impl Admission {
    pub fn new(max_total: usize, max_per_ip: usize) -> Admission {
        Admission {
            counts: Arc::default(),
            max_total,
            max_per_ip,
        }
    }

    /// Admits a connection from `ip`, or says why not. Taken once per accept; the lock
    /// is held for a map lookup.
    pub fn admit(&self, ip: IpAddr) -> Result<Ticket, Refusal> {
        let mut counts = self.lock();
        if counts.total >= self.max_total {
            return Err(Refusal::Full);
        }
        let mine = counts.per_ip.entry(ip).or_default();
        if self.max_per_ip > 0 && *mine >= self.max_per_ip {
            return Err(Refusal::PerIp);
        }
        *mine += 1;
        counts.total += 1;
        Ok(Ticket {
            admission: self.clone(),
            ip,
        })
    }

    /// Connections held now.
    pub fn connections(&self) -> usize {
        self.lock().total
    }

    fn lock(&self) -> MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut counts = self.admission.lock();
        counts.total -= 1;
        if let Some(n) = counts.per_ip.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                counts.per_ip.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    #[test]
    fn one_address_is_held_to_its_limit_while_others_connect() {
        let admission = Admission::new(10, 2);
        let a: Vec<_> = (0..2).map(|_| admission.admit(ip(1)).unwrap()).collect();
        assert_eq!(admission.admit(ip(1)).err(), Some(Refusal::PerIp));
        let _b = admission.admit(ip(2)).unwrap();
        drop(a);
        assert!(admission.admit(ip(1)).is_ok());
    }

    #[test]
    fn the_total_counts_every_connection() {
        let admission = Admission::new(3, 0);
        let held: Vec<_> = (1..=3).map(|n| admission.admit(ip(n)).unwrap()).collect();
        assert_eq!(admission.connections(), 3);
        assert_eq!(admission.admit(ip(9)).err(), Some(Refusal::Full));
        drop(held);
        assert_eq!(admission.connections(), 0);
        assert!(
            admission.lock().per_ip.is_empty(),
            "closed addresses are forgotten"
        );
    }

    #[test]
    fn zero_per_ip_means_no_limit() {
        let admission = Admission::new(1_000, 0);
        let held: Vec<_> = (0..500).map(|_| admission.admit(ip(1)).unwrap()).collect();
        assert_eq!(held.len(), 500);
    }
}
