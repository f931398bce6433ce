//! A session's socket that holds no read buffer while its client is quiet.
//!
//! The WebSocket reader (tungstenite) keeps a read buffer for the whole life of a
//! connection; at the size one read of the socket wants (4 KiB) that buffer was a quarter
//! of what an idle session cost. So the WebSocket's own buffer is kept small
//! (`--ws-buffer`), and this wrapper makes the socket reads: each takes up to
//! [`READ_CHUNK`] bytes into the stack, hands the reader what it asked for, and keeps
//! the rest in a buffer made for it, of its size, freed as soon as the reader took it.
//! A burst of frames costs one system call per chunk as before; a quiet client costs
//! nothing (docs/gateway.md, "Memory per session"). Writes pass straight through.

use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Most bytes one read of the socket takes (on the stack, for the read only): what a
/// busy client has sent by the time the session reads comes in one system call,
/// however small the WebSocket's buffer.
const READ_CHUNK: usize = crate::config::WS_READ_BUFFER;

/// A socket whose reads go through [`READ_CHUNK`]-sized chunks (see the module docs).
#[derive(Debug)]
pub(crate) struct LeanIo<S> {
    inner: S,
    /// Bytes read from the socket that the reader has not taken yet; empty (and
    /// unallocated) whenever the reader is waiting.
    rest: Vec<u8>,
    /// How much of `rest` the reader has taken.
    taken: usize,
}

impl<S> LeanIo<S> {
    pub(crate) fn new(inner: S) -> Self {
        LeanIo {
            inner,
            rest: Vec::new(),
            taken: 0,
        }
    }

    /// Heap bytes it holds for reads not yet taken (0 while its reader waits).
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.rest.capacity()
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for LeanIo<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        if this.taken < this.rest.len() {
            let n = (this.rest.len() - this.taken).min(buf.remaining());
            buf.put_slice(&this.rest[this.taken..this.taken + n]);
            this.taken += n;
            if this.taken == this.rest.len() {
                this.rest = Vec::new();
                this.taken = 0;
            }
            return Poll::Ready(Ok(()));
        }
        if buf.remaining() >= READ_CHUNK {
            return Pin::new(&mut this.inner).poll_read(cx, buf);
        }
        let mut chunk = [MaybeUninit::<u8>::uninit(); READ_CHUNK];
        let mut read = ReadBuf::uninit(&mut chunk);
        ready!(Pin::new(&mut this.inner).poll_read(cx, &mut read))?;
        let got = read.filled();
        let n = got.len().min(buf.remaining());
        buf.put_slice(&got[..n]);
        if n < got.len() {
            this.rest = got[n..].to_vec();
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for LeanIo<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[tokio::test]
    async fn small_reads_get_every_byte_in_order_and_the_rest_is_freed_once_taken() {
        let (mut client, server) = tokio::io::duplex(64 * 1024);
        let sent: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        client.write_all(&sent).await.unwrap();
        let mut lean = LeanIo::new(server);
        let mut got = Vec::new();
        let mut small = [0u8; 14];
        // A WebSocket reader asking for little at a time: one socket read of a chunk,
        // then the rest from memory.
        let n = lean.read(&mut small).await.unwrap();
        got.extend_from_slice(&small[..n]);
        assert_eq!(lean.held(), READ_CHUNK - n);
        while got.len() < sent.len() {
            let n = lean.read(&mut small).await.unwrap();
            got.extend_from_slice(&small[..n]);
        }
        assert_eq!(got, sent);
        assert_eq!(
            lean.held(),
            0,
            "nothing is held once the reader took it all"
        );
    }

    #[tokio::test]
    async fn a_read_as_large_as_a_chunk_goes_straight_to_the_socket() {
        let (mut client, server) = tokio::io::duplex(64 * 1024);
        client.write_all(&[7; 100]).await.unwrap();
        let mut lean = LeanIo::new(server);
        let mut big = vec![0u8; READ_CHUNK];
        assert_eq!(lean.read(&mut big).await.unwrap(), 100);
        assert_eq!(lean.held(), 0);
        drop(client);
        assert_eq!(
            lean.read(&mut big).await.unwrap(),
            0,
            "the end of the stream"
        );
    }
}
