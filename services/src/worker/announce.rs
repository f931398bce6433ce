//! The schema announcement: a worker tells the gates its service's message types
//! (`rpc::ServiceSchema`), so gates can give JSON clients typed bodies without being
//! rebuilt for a new service.
//!
//! The worker publishes its schema once it serves, again whenever anything publishes
//! on the ask subject (a gate that starts after the workers asks once it listens), and
//! again after each reconnect (a gate that started while the worker was away asked
//! without it). Every worker of a service announces the same schema; the gates keep the
//! latest per service, so repeats cost nothing but the message.

use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use proto::Message as _;
use proto::rpc::ServiceSchema;
use tokio_util::sync::CancellationToken;

use super::error::WorkerError;
use crate::bus::Signals;
use crate::bus::{Client, Subscriber};

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

    /// Announces now, on every ask, and after every connection `signals` reports,
    /// until `shutdown`.
    pub(crate) async fn run(mut self, signals: Option<Arc<Signals>>, shutdown: CancellationToken) {
        let connected = async |signals: &Option<Arc<Signals>>| match signals {
            Some(signals) => signals.connected().await,
            None => std::future::pending().await,
        };
        loop {
            // A lost announcement is repeated at the next ask; the bus being away is
            // the connection's business, reported there.
            let _ = self
                .client
                .publish(self.subject.clone(), self.payload.clone())
                .await;
            tokio::select! {
                ask = self.asks.next() => if ask.is_none() { return },
                () = connected(&signals) => {}
                () = shutdown.cancelled() => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bus::round_trip;
    use broker::testing::Bus;
    use futures::FutureExt as _;
    use testkit::within;

    /// A client subscribed to prefix `t`'s announcements, the broker holding the
    /// subscription before anything is published on it.
    async fn listen(bus: &Bus) -> (Client, Subscriber) {
        let listener = Client::from(async_nats::connect(bus.url()).await.unwrap());
        let heard = listener
            .subscribe(proto::schema::announcements("t"))
            .await
            .unwrap();
        round_trip(&listener).await;
        (listener, heard)
    }

    /// A worker announces at start and again when asked; a gate starting later learns it.
    async fn announces_at_start_and_when_asked(bus: Bus) {
        let client = Client::from(async_nats::connect(bus.url()).await.unwrap());
        let (listener, mut heard) = listen(&bus).await;
        let schema = crate::echo::service().schema();
        let announcer = Announcer::subscribe(&client, "t", &schema).await.unwrap();
        round_trip(&client).await;
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(announcer.run(None, shutdown.clone()));
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

    /// After a reconnect the worker announces again, unasked: a gate that started while
    /// it was away asked without it.
    async fn announces_again_after_a_reconnect(bus: Bus) {
        let client = crate::connect(&[bus.url().to_owned()], "t", &Default::default())
            .await
            .unwrap();
        let (listener, mut heard) = listen(&bus).await;
        let schema = crate::echo::service().schema();
        let announcer = Announcer::subscribe(&client, "t", &schema).await.unwrap();
        round_trip(&client).await;
        let signals = crate::bus::signals(&client).expect("connect registers its signals");
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(announcer.run(Some(signals), shutdown.clone()));
        within(heard.next()).await.unwrap();
        // The first connection's notice may bring one more; a round trip after it, none
        // is left.
        round_trip(&client).await;
        round_trip(&listener).await;
        while heard.next().now_or_never().flatten().is_some() {}
        client.force_reconnect().await.unwrap();
        let again = within(heard.next()).await.unwrap();
        assert_eq!(ServiceSchema::decode(again.payload).unwrap(), schema);
        shutdown.cancel();
        within(task).await.unwrap();
    }

    broker::on_both_buses!(
        announces_at_start_and_when_asked,
        announces_again_after_a_reconnect
    );
}
