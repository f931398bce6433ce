//! The schema announcement: a worker tells the gates its service's message types
//! (`rpc::ServiceSchema`), so gates can give JSON clients typed bodies without being
//! rebuilt for a new service.
//!
//! The worker publishes its schema once it serves, and again whenever anything
//! publishes on the ask subject: a gate that starts after the workers asks once it
//! listens. Every worker of a service announces the same schema; the gates keep the
//! latest per service, so repeats cost nothing but the message.

use async_nats::{Client, Subscriber};
use bytes::Bytes;
use futures::StreamExt;
use proto::Message as _;
use proto::rpc::ServiceSchema;
use tokio_util::sync::CancellationToken;

use crate::worker::WorkerError;

/// A worker's announcement, subscribed to the ask subject.
pub(crate) struct Announcer {
    client: Client,
    subject: String,
    payload: Bytes,
    asks: Subscriber,
}

impl Announcer {
    /// Subscribes the ask subject; the first announcement goes out with [`run`].
    pub(crate) async fn subscribe(
        client: &Client,
        prefix: &str,
        schema: &ServiceSchema,
    ) -> Result<Announcer, WorkerError> {
        let ask = proto::schema::ask_subject(prefix);
        let asks =
            client
                .subscribe(ask.clone())
                .await
                .map_err(|source| WorkerError::Subscribe {
                    subject: ask,
                    source,
                })?;
        Ok(Announcer {
            client: client.clone(),
            subject: proto::schema::announce_subject(prefix, &schema.service),
            payload: schema.encode_to_vec().into(),
            asks,
        })
    }

    /// Announces now and on every ask, until `shutdown`.
    pub(crate) async fn run(mut self, shutdown: CancellationToken) {
        loop {
            // A lost announcement is repeated at the next ask; the bus being away is
            // the connection's business, reported there.
            let _ = self
                .client
                .publish(self.subject.clone(), self.payload.clone())
                .await;
            tokio::select! {
                ask = self.asks.next() => if ask.is_none() { return },
                () = shutdown.cancelled() => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use broker::testing::{Bus, round_trip, within};

    /// A worker announces at start and again when asked; a gate starting later learns it.
    async fn announces_at_start_and_when_asked(bus: Bus) {
        let client = async_nats::connect(bus.url()).await.unwrap();
        let listener = async_nats::connect(bus.url()).await.unwrap();
        let mut heard = listener
            .subscribe(proto::schema::announcements("t"))
            .await
            .unwrap();
        // The broker has both subscriptions before anything is published on them.
        round_trip(&listener).await;
        let schema = crate::echo::service().schema().expect("echo announces");
        let announcer = Announcer::subscribe(&client, "t", &schema).await.unwrap();
        round_trip(&client).await;
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(announcer.run(shutdown.clone()));
        let first = within(heard.next()).await.unwrap();
        assert_eq!(first.subject.as_str(), "t.schema.svc.echo");
        assert_eq!(ServiceSchema::decode(first.payload).unwrap(), schema);
        listener
            .publish(proto::schema::ask_subject("t"), Bytes::new())
            .await
            .unwrap();
        let again = within(heard.next()).await.unwrap();
        assert_eq!(ServiceSchema::decode(again.payload).unwrap(), schema);
        shutdown.cancel();
        within(task).await.unwrap();
    }

    broker::on_both_buses!(announces_at_start_and_when_asked);
}
