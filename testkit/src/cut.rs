//! A TCP hop that cuts every connection through it on command, as a dropped mobile link
//! would: both sides see their stream end, with no WebSocket close from either, while
//! connections made after the cut go through as before. For the resume tests and the
//! load tester's flapping clients.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};

pub struct Cut {
    /// Where clients connect.
    pub addr: SocketAddr,
    /// Bumped by each cut: connections made before it end.
    generation: Arc<watch::Sender<u64>>,
    /// Dropped with the hop: it stops accepting.
    _stop: oneshot::Sender<()>,
}

impl Cut {
    /// Listens on 127.0.0.1:0 and forwards each connection to `target`; a connection
    /// the target refuses is dropped.
    pub async fn start(target: SocketAddr) -> std::io::Result<Cut> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let generation = Arc::new(watch::Sender::new(0u64));
        let cuts = generation.clone();
        let (stop, mut stopped) = oneshot::channel();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((client, _)) = accepted else { continue };
                        tokio::spawn(forward(client, target, cuts.subscribe()));
                    }
                    _ = &mut stopped => break,
                }
            }
        });
        Ok(Cut {
            addr,
            generation,
            _stop: stop,
        })
    }

    /// `ws://` and the hop's address.
    pub fn ws_url(&self) -> String {
        format!("ws://{}", self.addr)
    }

    /// Ends every connection made so far.
    pub fn cut(&self) {
        self.generation.send_modify(|g| *g += 1);
    }
}

async fn forward(mut client: TcpStream, target: SocketAddr, mut cut: watch::Receiver<u64>) {
    let born = *cut.borrow_and_update();
    let Ok(mut upstream) = TcpStream::connect(target).await else {
        return;
    };
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {}
        _ = cut.wait_for(|&now| now != born) => {}
    }
    // Both sockets drop here: each side sees its stream end.
}
