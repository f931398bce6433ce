//! A TCP hop between one worker and the broker that the test can cut: the worker dies
//! as a crashed process would (its socket gone, nothing said), while the test keeps an
//! exact record of every message the broker delivered to it.
//!
//! Cutting drops the worker's side at once and closes the listener, so the worker's
//! client cannot reconnect; towards the broker it sends FIN and keeps reading, still
//! recording, until the broker closes its side. Once [`Proxy::cut`] returns the broker
//! has dropped the connection and its queue subscription, and the record holds
//! everything that was ever sent to the dead worker.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::within;

/// Bytes the broker sent, one buffer per proxied connection.
type Record = Arc<Mutex<Vec<Vec<u8>>>>;

pub struct Proxy {
    url: String,
    cut: CancellationToken,
    connections: TaskTracker,
    record: Record,
    /// Bumped whenever the record grows.
    grew: watch::Receiver<u64>,
}

/// A message the broker delivered through the proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub subject: String,
    pub reply: Option<String>,
}

impl Proxy {
    /// Listens on 127.0.0.1:0 and forwards each connection to `broker`.
    pub async fn start(broker: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("nats://{}", listener.local_addr().unwrap());
        let cut = CancellationToken::new();
        let connections = TaskTracker::new();
        let record = Record::default();
        let (grew_tx, grew) = watch::channel(0);
        let grew_tx = Arc::new(grew_tx);
        let (accept_cut, accept_connections, accept_record) =
            (cut.clone(), connections.clone(), record.clone());
        tokio::spawn(async move {
            loop {
                let worker = tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok((worker, _)) => worker,
                        Err(_) => continue,
                    },
                    // Dropping the listener refuses the worker's reconnection attempts.
                    () = accept_cut.cancelled() => break,
                };
                let index = {
                    let mut record = accept_record.lock().unwrap();
                    record.push(Vec::new());
                    record.len() - 1
                };
                let link = Link {
                    record: accept_record.clone(),
                    index,
                    grew: grew_tx.clone(),
                };
                accept_connections.spawn(link.forward(worker, broker, accept_cut.clone()));
            }
        });
        Proxy {
            url,
            cut,
            connections,
            record,
            grew,
        }
    }

    /// Where the worker connects instead of the broker.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Kills the worker's connection (see the module docs); returns once the broker has
    /// closed its side.
    pub async fn cut(&self) {
        self.cut.cancel();
        self.connections.close();
        within(self.connections.wait()).await;
    }

    /// Waits until the broker sends more through the proxy.
    pub async fn grown(&mut self) {
        within(self.grew.changed()).await.unwrap();
    }

    /// Every message the broker has delivered through the proxy so far.
    pub fn deliveries(&self) -> Vec<Delivery> {
        let record = self.record.lock().unwrap();
        record.iter().flat_map(|bytes| deliveries(bytes)).collect()
    }
}

/// One proxied connection.
struct Link {
    record: Record,
    index: usize,
    grew: Arc<watch::Sender<u64>>,
}

impl Link {
    fn keep(&self, bytes: &[u8]) {
        self.record.lock().unwrap()[self.index].extend_from_slice(bytes);
        self.grew.send_modify(|n| *n += 1);
    }

    async fn forward(self, worker: TcpStream, broker: SocketAddr, cut: CancellationToken) {
        let Ok(broker) = TcpStream::connect(broker).await else {
            return;
        };
        let (mut from_broker, mut to_broker) = broker.into_split();
        let (mut from_worker, mut to_worker) = worker.into_split();
        let mut buf = vec![0; 16 * 1024];
        {
            let up = tokio::io::copy(&mut from_worker, &mut to_broker);
            let down = async {
                loop {
                    let n = from_broker.read(&mut buf).await?;
                    if n == 0 {
                        return Ok::<_, std::io::Error>(());
                    }
                    self.keep(&buf[..n]);
                    to_worker.write_all(&buf[..n]).await?;
                }
            };
            tokio::select! {
                _ = up => return,
                _ = down => return,
                () = cut.cancelled() => {}
            }
        }
        // The worker is gone without a word: no close, no flush.
        drop((from_worker, to_worker));
        let _ = to_broker.shutdown().await;
        // Whatever the broker still sends is lost with the worker: record it, until the
        // broker closes the connection.
        loop {
            match from_broker.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => self.keep(&buf[..n]),
            }
        }
    }
}

/// The `MSG`/`HMSG` deliveries in a broker-to-client byte stream of the NATS protocol;
/// a message cut off at the end is left out.
pub fn deliveries(mut bytes: &[u8]) -> Vec<Delivery> {
    let mut found = Vec::new();
    while let Some(end) = bytes.windows(2).position(|w| w == b"\r\n") {
        let line = String::from_utf8_lossy(&bytes[..end]).into_owned();
        bytes = &bytes[end + 2..];
        let args: Vec<&str> = line.split_ascii_whitespace().collect();
        // MSG <subject> <sid> [reply] <size>; HMSG <subject> <sid> [reply] <hdr> <size>.
        let (reply_at, fixed) = match args.first() {
            Some(&"MSG") => (3, 4),
            Some(&"HMSG") => (3, 5),
            _ => continue, // INFO, PING, PONG, +OK, -ERR
        };
        let size: usize = args.last().unwrap().parse().unwrap();
        if bytes.len() < size + 2 {
            break;
        }
        bytes = &bytes[size + 2..];
        found.push(Delivery {
            subject: args[1].to_owned(),
            reply: (args.len() > fixed).then(|| args[reply_at].to_owned()),
        });
    }
    found
}

#[test]
fn deliveries_parse_msg_and_hmsg_and_skip_the_rest() {
    let stream = b"INFO {}\r\nPING\r\nMSG a.b 1 _R.1 2\r\nhi\r\nMSG c 2 0\r\n\r\n\
                   HMSG d 3 r 12 14\r\nNATS/1.0\r\n\r\nhi\r\nMSG e 1 5\r\nhel";
    let got = deliveries(stream);
    let want = |subject: &str, reply: Option<&str>| Delivery {
        subject: subject.to_owned(),
        reply: reply.map(str::to_owned),
    };
    assert_eq!(
        got,
        [
            want("a.b", Some("_R.1")),
            want("c", None),
            want("d", Some("r"))
        ]
    );
}
