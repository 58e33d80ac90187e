//! A buffered connection: a read buffer we frame messages in, and an output queue of byte
//! runs written with one vectored write. Forwarded bytes are split off the read buffer of
//! one side and queued on the other side without copying.
use std::collections::VecDeque;
use std::future::poll_fn;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncWrite, AsyncWriteExt};

use super::Stream;
use crate::proto::{self, Header, ProtoError};

/// Bytes we try to have free in the read buffer before each read.
const READ_CHUNK: usize = 16 * 1024;
/// `queue_with` makes room for its messages `SCRATCH_CHUNK` bytes at a time, when less than
/// `SCRATCH_MIN` is left.
const SCRATCH_MIN: usize = 64;
const SCRATCH_CHUNK: usize = 512;
/// Most byte runs handed to one vectored write.
const MAX_IOV: usize = 64;
/// A connection we close: how long its last words may take to be written.
const CLOSE_FLUSH: Duration = Duration::from_secs(2);
/// A connection we close: how long, and how many bytes, we read and discard of what its
/// peer still sends after our last words, so that its kernel does not reset the
/// connection (and drop those words) for bytes it never read.
pub const LINGER: Duration = Duration::from_secs(1);
pub const LINGER_BYTES: usize = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    #[error("connection closed")]
    Closed,
    #[error(transparent)]
    Io(#[from] io::Error),
    #[error(transparent)]
    Proto(#[from] ProtoError),
}

pub struct Conn {
    pub stream: Stream,
    /// Bytes read and not yet consumed or forwarded.
    pub rbuf: BytesMut,
    out: VecDeque<Bytes>,
    out_len: usize,
    /// Where small messages of our own are built before being queued.
    scratch: BytesMut,
}

impl Conn {
    pub fn new(stream: Stream) -> Self {
        Conn {
            stream,
            rbuf: BytesMut::new(),
            out: VecDeque::new(),
            out_len: 0,
            scratch: BytesMut::new(),
        }
    }

    /// Queue bytes for writing (after everything queued before).
    #[inline]
    pub fn queue(&mut self, b: Bytes) {
        if !b.is_empty() {
            self.out_len += b.len();
            self.out.push_back(b);
        }
    }

    /// Build a message of our own with `f` and queue it.
    #[inline]
    pub fn queue_with(&mut self, f: impl FnOnce(&mut BytesMut)) {
        // Room for a few messages at once: one allocation, not one per field written.
        if self.scratch.capacity() < SCRATCH_MIN {
            self.scratch.reserve(SCRATCH_CHUNK);
        }
        f(&mut self.scratch);
        let b = self.scratch.split().freeze();
        self.queue(b);
    }

    /// Bytes queued and not yet written.
    #[inline]
    pub fn out_len(&self) -> usize {
        self.out_len
    }

    /// Everything queued, in order (unit tests of what is sent).
    #[cfg(test)]
    pub fn queued(&self) -> Vec<u8> {
        self.out.iter().flat_map(|b| b.iter().copied()).collect()
    }

    /// Drop everything queued without writing it; returns how many bytes that was. For
    /// micro-benchmarks (`benches/`), which measure the scan and queueing, not the socket.
    #[doc(hidden)]
    pub fn discard_out(&mut self) -> usize {
        self.out.clear();
        std::mem::take(&mut self.out_len)
    }

    /// Read more bytes into `rbuf`. `Ok(0)` means end of stream.
    pub fn poll_read_more(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.rbuf.capacity() - self.rbuf.len() < READ_CHUNK / 4 {
            if self.rbuf.capacity() == 0
                && let Some(b) = spare::take()
            {
                self.rbuf = b;
            }
            self.rbuf.reserve(READ_CHUNK);
        }
        tokio_util::io::poll_read_buf(Pin::new(&mut self.stream), cx, &mut self.rbuf)
    }

    /// Write queued output until the queue is empty (Ready) or the socket is full (Pending).
    pub fn poll_write_out(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Some(front) = self.out.front() {
            if self.out.len() == 1 {
                // One run (the usual reply or request): a plain `send`, which costs the
                // kernel less than `writev` (no iovec to import, no VFS layer).
                let n = ready!(Pin::new(&mut self.stream).poll_write(cx, front))?;
                if n == 0 {
                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                }
                self.advance_out(n);
                continue;
            }
            let mut iov = [IoSlice::new(&[]); MAX_IOV];
            let mut n_iov = 0;
            for (slot, b) in iov.iter_mut().zip(self.out.iter()) {
                *slot = IoSlice::new(b);
                n_iov += 1;
            }
            let n = ready!(Pin::new(&mut self.stream).poll_write_vectored(cx, &iov[..n_iov]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.advance_out(n);
        }
        // TLS takes the bytes into its session and may hold records the socket had no room
        // for: they must go out too before the queue counts as written.
        if self.stream.wants_write() {
            ready!(Pin::new(&mut self.stream).poll_flush(cx))?;
        }
        Poll::Ready(Ok(()))
    }

    /// Output not yet on the socket: queued here, or (TLS) encrypted and held by the session.
    #[inline]
    pub fn out_pending(&self) -> bool {
        self.out_len > 0 || self.stream.wants_write()
    }

    fn advance_out(&mut self, mut n: usize) {
        self.out_len -= n;
        while n > 0 {
            let front = self.out.front_mut().expect("wrote more than queued");
            if front.len() <= n {
                n -= front.len();
                self.out.pop_front();
            } else {
                let _ = front.split_to(n);
                n = 0;
            }
        }
    }

    /// Write everything queued.
    pub async fn flush(&mut self) -> io::Result<()> {
        poll_fn(|cx| self.poll_write_out(cx)).await
    }

    /// Close a connection we end (after queueing our last words, an ErrorResponse): write
    /// what is queued, shut our side down (the peer reads our words, then EOF), and read and
    /// discard what the peer still sends until it closes too, for at most [`LINGER`] and
    /// [`LINGER_BYTES`]. Closing a socket with unread input makes the kernel send RST, and a
    /// peer that gets RST may lose our words still in its receive buffer.
    pub async fn close(mut self) {
        let written = tokio::time::timeout(CLOSE_FLUSH, async {
            self.flush().await?;
            self.stream.shutdown().await
        })
        .await;
        if !matches!(written, Ok(Ok(()))) {
            return;
        }
        self.rbuf.clear();
        let mut drained = 0usize;
        let _ = tokio::time::timeout(LINGER, async {
            while drained < LINGER_BYTES {
                match poll_fn(|cx| self.poll_read_more(cx)).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        drained += n;
                        self.rbuf.clear();
                    }
                }
            }
        })
        .await;
    }

    /// Make sure at least `n` bytes are buffered.
    pub async fn fill(&mut self, n: usize) -> Result<(), ConnError> {
        while self.rbuf.len() < n {
            if poll_fn(|cx| self.poll_read_more(cx)).await? == 0 {
                return Err(ConnError::Closed);
            }
        }
        Ok(())
    }

    /// Wait until a whole message (at most `limit` bytes) sits at the front of `rbuf`;
    /// its body is `rbuf[5..header.total]`. Consume it with `consume(header.total)`.
    pub async fn read_message(&mut self, limit: usize) -> Result<Header, ConnError> {
        self.fill(5).await?;
        let h = proto::header(&self.rbuf, limit)?.expect("5 bytes buffered");
        self.fill(h.total).await?;
        Ok(h)
    }

    /// Drop `n` bytes from the front of the read buffer.
    pub fn consume(&mut self, n: usize) {
        bytes::Buf::advance(&mut self.rbuf, n);
    }

    /// Shrink buffers of an idle connection (idle clients hold no buffers at all).
    pub fn shrink(&mut self) {
        if self.rbuf.is_empty() && self.rbuf.capacity() > 0 {
            spare::give(std::mem::take(&mut self.rbuf));
        }
        if self.scratch.capacity() > 4096 {
            self.scratch = BytesMut::new();
        }
    }

    /// For a server going back to its pool: servers are few (a pool's size), so one keeps
    /// a read buffer of the usual size, which its next transaction reads into in place once
    /// the replies forwarded from it are written (a buffer given away while they are still
    /// queued for the client could not be kept, and each transaction would make a new one).
    /// Only a larger one goes, and a large scratch buffer.
    pub fn shrink_kept(&mut self) {
        if self.rbuf.is_empty() && self.rbuf.capacity() > 2 * READ_CHUNK {
            spare::give(std::mem::take(&mut self.rbuf));
        }
        if self.scratch.capacity() > 4096 {
            self.scratch = BytesMut::new();
        }
    }

    /// Like `shrink`, and also drop the buffer our own messages are built in and the output
    /// queue's storage: for clients, which may sit idle by the thousand.
    pub fn shrink_all(&mut self) {
        self.shrink();
        if self.out.is_empty() {
            self.scratch = BytesMut::new();
            self.out = VecDeque::new();
        }
    }
}

impl Drop for Conn {
    /// A connection that closes hands its read buffer to the next one (short connections).
    fn drop(&mut self) {
        if self.rbuf.capacity() > 0 {
            spare::give(std::mem::take(&mut self.rbuf));
        }
    }
}

/// Read buffers of connections gone idle, kept per thread for the next connection that
/// reads: a busy pooler moves the same few buffers between clients instead of freeing and
/// allocating 16 KiB per transaction, and idle clients still hold none.
mod spare {
    use std::cell::RefCell;

    use bytes::BytesMut;

    use super::READ_CHUNK;

    /// Buffers kept per thread (16 KiB each).
    const KEEP: usize = 64;

    thread_local! {
        static SPARE: RefCell<Vec<BytesMut>> = const { RefCell::new(Vec::new()) };
    }

    pub(super) fn take() -> Option<BytesMut> {
        SPARE.with(|s| s.borrow_mut().pop())
    }

    /// Keep an empty buffer if it is a whole read buffer and there is room.
    pub(super) fn give(mut b: BytesMut) {
        b.clear();
        // Only buffers whose storage is ours alone and whole again are worth keeping.
        if !b.try_reclaim(READ_CHUNK) {
            return;
        }
        SPARE.with(|s| {
            let mut s = s.borrow_mut();
            if s.len() < KEEP {
                s.push(b);
            }
        });
    }
}
