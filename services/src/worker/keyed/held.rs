//! What a keyed worker holds, for its user to watch.

use proto::rpc::KeyedMember;
use tokio::sync::watch;

/// How many partitions a keyed worker holds, as it changes ([`Worker::held`]).
///
/// [`Worker::held`]: crate::Worker::held
#[derive(Debug, Clone)]
pub struct HeldPartitions(watch::Receiver<KeyedMember>);

impl HeldPartitions {
    /// Watches the heartbeats the worker says.
    pub(super) fn new(heartbeats: watch::Receiver<KeyedMember>) -> Self {
        HeldPartitions(heartbeats)
    }

    /// The partitions held now.
    pub fn count(&self) -> usize {
        self.0.borrow().held.len()
    }

    /// Waits until the worker holds at least `n` partitions; false if it stopped first.
    pub async fn at_least(&mut self, n: usize) -> bool {
        self.0
            .wait_for(|member| member.held.len() >= n)
            .await
            .is_ok()
    }
}
