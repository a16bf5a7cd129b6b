//! An IO wrapper whose connection a fault script can tear down.
//!
//! Every accepted stream is wrapped in [`KillableIo`]. Its `ConnectInfo` (which tonic puts into
//! each request's extensions) is the connection's [`KillSwitch`]; a handler that trips it makes
//! every later read and write on the stream fail, so hyper drops the connection and the client
//! sees a transport error. A read or write already waiting is woken so the failure is seen at
//! once.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;

#[derive(Debug, Default)]
struct KillState {
    tripped: AtomicBool,
    /// The last waker of a pending read and of a pending write.
    wakers: Mutex<[Option<Waker>; 2]>,
}

/// Trips one connection. Cloned into every request that arrives on it.
#[derive(Clone, Debug, Default)]
pub(crate) struct KillSwitch(Arc<KillState>);

const READ: usize = 0;
const WRITE: usize = 1;

impl KillSwitch {
    /// Makes the connection fail; wakes any read or write waiting on it.
    pub(crate) fn trip(&self) {
        self.0.tripped.store(true, Ordering::SeqCst);
        let wakers =
            std::mem::take(&mut *self.0.wakers.lock().unwrap_or_else(PoisonError::into_inner));
        for waker in wakers.into_iter().flatten() {
            waker.wake();
        }
    }

    fn is_tripped(&self) -> bool {
        self.0.tripped.load(Ordering::SeqCst)
    }

    fn park(&self, slot: usize, cx: &Context<'_>) {
        let mut wakers = self.0.wakers.lock().unwrap_or_else(PoisonError::into_inner);
        wakers[slot] = Some(cx.waker().clone());
    }
}

fn killed() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        "connection dropped by a mock fault script",
    )
}

/// A stream that fails once its [`KillSwitch`] is tripped.
#[derive(Debug)]
pub(crate) struct KillableIo<T> {
    inner: T,
    switch: KillSwitch,
}

impl<T> KillableIo<T> {
    pub(crate) fn new(inner: T) -> Self {
        KillableIo {
            inner,
            switch: KillSwitch::default(),
        }
    }

    fn check<R>(
        &self,
        slot: usize,
        cx: &Context<'_>,
        poll: Poll<io::Result<R>>,
    ) -> Poll<io::Result<R>> {
        if self.switch.is_tripped() {
            return Poll::Ready(Err(killed()));
        }
        if poll.is_pending() {
            self.switch.park(slot, cx);
            // Tripped between the first check and parking: do not sleep through it.
            if self.switch.is_tripped() {
                return Poll::Ready(Err(killed()));
            }
        }
        poll
    }
}

impl<T> Connected for KillableIo<T> {
    type ConnectInfo = KillSwitch;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.switch.clone()
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for KillableIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.switch.is_tripped() {
            return Poll::Ready(Err(killed()));
        }
        let poll = Pin::new(&mut this.inner).poll_read(cx, buf);
        this.check(READ, cx, poll)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for KillableIo<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.switch.is_tripped() {
            return Poll::Ready(Err(killed()));
        }
        let poll = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.check(WRITE, cx, poll)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.switch.is_tripped() {
            return Poll::Ready(Err(killed()));
        }
        let poll = Pin::new(&mut this.inner).poll_flush(cx);
        this.check(WRITE, cx, poll)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Closing must still work after a trip, so the underlying stream is released.
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn tripping_fails_a_pending_read_and_later_writes() {
        let (a, mut b) = tokio::io::duplex(64);
        let mut io = KillableIo::new(a);
        let switch = io.connect_info();
        let reader = tokio::spawn(async move {
            let mut buf = [0u8; 8];
            let read = io.read(&mut buf).await;
            (read.map_err(|e| e.kind()), io)
        });
        // Let the reader park, then trip it.
        tokio::task::yield_now().await;
        switch.trip();
        let (read, mut io) = reader.await.unwrap();
        assert_eq!(read, Err(io::ErrorKind::ConnectionAborted));
        assert_eq!(
            io.write_all(b"x").await.map_err(|e| e.kind()),
            Err(io::ErrorKind::ConnectionAborted)
        );
        // The peer was not written to.
        drop(io);
        let mut rest = Vec::new();
        b.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty());
    }
}
