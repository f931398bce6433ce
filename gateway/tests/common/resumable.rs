//! A client of resumable sessions as docs/protocol.md ("Resume") describes one, for the
//! resume tests: it keeps the latest resume token and the highest seq it handled, drops
//! repeats and acks; with a service whose sessions enter a hall and talk in it, and
//! handshake tokens that name a player.

use std::collections::HashMap;

use gateway::{AuthError, Identity, TokenCheck};
use proto::client::{Ack, Handshake, HandshakeAck, Heartbeat, packet::Kind};
use proto::code;
use services::{HandlerError, Service};

use super::raw::RawClient;

/// The room everyone enters.
pub const HALL: &str = "hall";

/// `room.enter` binds the player named in the body and joins the hall; `room.say`
/// broadcasts its body to the hall; `room.who` answers the session as services see it.
pub fn room_service() -> Service {
    Service::new("room")
        .raw_method("enter", |ctx, body| {
            let name = std::str::from_utf8(&body)
                .map_err(|_| HandlerError::bad_request("name is not UTF-8"))?
                .to_owned();
            ctx.bind_uid(name);
            ctx.join(HALL);
            Ok(body)
        })
        .raw_method("say", |ctx, body| {
            ctx.broadcast(HALL, "room.said", body.clone())?;
            Ok(body)
        })
        .raw_method("who", |ctx, _body| {
            Ok(format!("{} {} {}", ctx.gate(), ctx.sid(), ctx.uid().unwrap_or("")).into())
        })
}

/// Handshake tokens `player:<name>` name the player, as a signed token would.
pub struct PlayerTokens;

impl TokenCheck for PlayerTokens {
    fn check(&self, token: &str) -> Result<Option<Identity>, AuthError> {
        let uid = token.strip_prefix("player:").ok_or(AuthError::Refused)?;
        Ok(Some(Identity {
            uid: uid.to_owned(),
            claims: HashMap::new(),
            expires: None,
        }))
    }
}

/// A client of a resumable session, as docs/protocol.md describes one: it keeps the
/// latest resume token and the highest seq it handled, drops repeats, acks.
pub struct Player {
    pub raw: RawClient,
    pub token: String,
    pub last_seq: u64,
    next_id: u64,
}

/// What a player handled: a push's body or a response's (id, code, body).
#[derive(Debug, PartialEq, Eq)]
pub enum Got {
    Push(String),
    Response(u64, u32, String),
}

impl Player {
    /// Opens a resumable session at `url` with `token`.
    pub async fn open(url: &str, token: &str) -> Player {
        let handshake = Handshake {
            token: token.into(),
            ..Handshake::default()
        };
        Player::open_with(url, handshake).await
    }

    /// Opens a resumable session at `url` with `handshake` (made resumable).
    pub async fn open_with(url: &str, handshake: Handshake) -> Player {
        let mut raw = RawClient::connect(url).await;
        let ack = raw
            .handshake(Handshake {
                resumable: true,
                ..handshake
            })
            .await;
        assert_eq!((ack.code, ack.resume_code), (code::OK, 0), "{ack:?}");
        assert!(!ack.resume_token.is_empty(), "{ack:?}");
        Player {
            raw,
            token: ack.resume_token,
            last_seq: 0,
            next_id: 1,
        }
    }

    /// Opens a session and enters the hall as `name`.
    pub async fn enter(url: &str, name: &str) -> Player {
        let mut player = Player::open(url, "").await;
        let id = player.send("room.enter", name).await;
        assert_eq!(
            player.next().await,
            Got::Response(id, code::OK, name.into())
        );
        player
    }

    /// Resumes this player's session at `url` with `token`: the handshake's answer.
    pub async fn try_resume(&mut self, url: &str, token: &str) -> HandshakeAck {
        self.raw = RawClient::connect(url).await;
        let ack = self
            .raw
            .handshake(Handshake {
                token: token.into(),
                resumable: true,
                resume_token: self.token.clone(),
                last_seq: self.last_seq,
                ..Handshake::default()
            })
            .await;
        self.token.clone_from(&ack.resume_token);
        if ack.resume_code != code::OK {
            // A fresh session counts from 1 again.
            self.last_seq = 0;
        }
        ack
    }

    /// Resumes, which must succeed.
    pub async fn resume(&mut self, url: &str) {
        let ack = self.try_resume(url, "").await;
        assert_eq!((ack.code, ack.resume_code), (code::OK, code::OK), "{ack:?}");
        assert!(ack.last_seq >= self.last_seq, "{ack:?}");
    }

    /// Sends request `route` with `body` under the next id; returns the id.
    pub async fn send(&mut self, route: &str, body: &str) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.send_as(id, route, body).await;
        id
    }

    pub async fn send_as(&mut self, id: u64, route: &str, body: &str) {
        self.raw.request(id, route, body).await;
    }

    /// Acknowledges every frame handled so far.
    pub async fn ack(&mut self) {
        let seq = self.last_seq;
        self.raw.send_packet(Kind::Ack(Ack { seq })).await;
    }

    /// Returns once the gate has read everything sent before: a heartbeat's answer
    /// comes after them. Nothing else may come meanwhile.
    pub async fn sync(&mut self) {
        self.raw.send_packet(Kind::Heartbeat(Heartbeat {})).await;
        match self.raw.next_packet().await.kind {
            Some(Kind::Heartbeat(_)) => {}
            other => panic!("expected the heartbeat's answer, got {other:?}"),
        }
    }

    /// The next push or response not handled before; acks every 64.
    pub async fn next(&mut self) -> Got {
        loop {
            let packet = self.raw.next_packet().await;
            let (seq, got) = match packet.kind {
                Some(Kind::Push(p)) => (p.seq, Got::Push(text(&p.body))),
                Some(Kind::Response(r)) => (r.seq, Got::Response(r.id, r.code, text(&r.body))),
                Some(Kind::Heartbeat(_)) => continue,
                other => panic!("unexpected {other:?}"),
            };
            assert_ne!(seq, 0, "a resumable session numbers {got:?}");
            if seq <= self.last_seq {
                continue;
            }
            assert_eq!(seq, self.last_seq + 1, "no gap before {got:?}");
            self.last_seq = seq;
            if seq % 64 == 0 {
                self.raw.send_packet(Kind::Ack(Ack { seq })).await;
            }
            return got;
        }
    }
}

pub fn text(body: &[u8]) -> String {
    String::from_utf8_lossy(body).into_owned()
}
