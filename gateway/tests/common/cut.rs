//! A TCP hop between clients and a gate that the test cuts, as a dropped mobile link
//! would: every connection through it ends at once on both sides, with no WebSocket
//! close from either, while new connections go through as before.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct Cut {
    /// `ws://` and the hop's address.
    pub url: String,
    /// Bumped by each cut: connections made before it end.
    generation: Arc<watch::Sender<u64>>,
}

impl Cut {
    /// Listens on 127.0.0.1:0 and forwards each connection to `gate`.
    pub async fn start(gate: SocketAddr) -> Cut {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("ws://{}", listener.local_addr().unwrap());
        let generation = Arc::new(watch::Sender::new(0u64));
        let cuts = generation.clone();
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let mut cut = cuts.subscribe();
                let born = *cut.borrow_and_update();
                tokio::spawn(async move {
                    let Ok(mut upstream) = TcpStream::connect(gate).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {}
                        _ = cut.wait_for(|&now| now != born) => {}
                    }
                    // Both sockets drop here: each side sees its stream end.
                });
            }
        });
        Cut { url, generation }
    }

    /// Ends every connection made so far.
    pub fn cut(&self) {
        self.generation.send_modify(|g| *g += 1);
    }
}
