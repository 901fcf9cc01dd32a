//! A loopback HTTP/1.1 proxy between one service and its peer ([`Proxy`]):
//! each request on its own upstream connection, with seeded chances to drop
//! the answer or replay the request later, and a switch that refuses every
//! connection. It counts what it did.
//!
//! It never changes a request or an answer: a fault is a lost or repeated
//! exchange, never a corrupted one.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::ensure;
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};

/// A loopback HTTP/1.1 proxy between one service and its peer. Each request
/// travels on its own upstream connection; the proxy can drop the answer
/// (the receiver processed the message, the sender never hears of it),
/// replay a delivered request later (a duplicate storm), or refuse every
/// connection (the peer is unreachable).
pub(crate) struct Proxy {
    pub(crate) port: u16,
    pub(crate) state: Arc<ProxyState>,
    pub(crate) task: tokio::task::JoinHandle<()>,
}

/// What the proxy does, and what it counted.
pub(crate) struct ProxyState {
    pub(crate) upstream: SocketAddr,
    pub(crate) drop_answer: f64,
    pub(crate) replay: f64,
    pub(crate) rng: std::sync::Mutex<StdRng>,
    pub(crate) down: AtomicBool,
    pub(crate) requests: AtomicU64,
    pub(crate) dropped_answers: AtomicU64,
    pub(crate) replays: AtomicU64,
    pub(crate) refused: AtomicU64,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Proxy {
    pub(crate) async fn start(
        upstream: SocketAddr,
        drop_answer: f64,
        replay: f64,
        seed: u64,
    ) -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let state = Arc::new(ProxyState {
            upstream,
            drop_answer,
            replay,
            rng: std::sync::Mutex::new(StdRng::seed_from_u64(seed)),
            down: AtomicBool::new(false),
            requests: AtomicU64::new(0),
            dropped_answers: AtomicU64::new(0),
            replays: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        });
        let task = {
            let state = state.clone();
            tokio::spawn(async move {
                while let Ok((client, _)) = listener.accept().await {
                    if state.down.load(Ordering::SeqCst) {
                        state.refused.fetch_add(1, Ordering::Relaxed);
                        drop(client);
                        continue;
                    }
                    let state = state.clone();
                    tokio::spawn(async move {
                        let _ = relay(client, &state).await;
                    });
                }
            })
        };
        Ok(Self { port, state, task })
    }

    pub(crate) fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub(crate) fn count(&self, counter: impl Fn(&ProxyState) -> &AtomicU64) -> u64 {
        counter(&self.state).load(Ordering::Relaxed)
    }
}

/// Reads one HTTP/1.1 request (headers and a `Content-Length` body).
pub(crate) async fn read_request(
    stream: &mut tokio::net::TcpStream,
) -> anyhow::Result<Option<(String, Vec<u8>)>> {
    use tokio::io::AsyncReadExt as _;
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    let header_end = loop {
        if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break at;
        }
        let read = stream.read(&mut chunk).await?;
        if read == 0 {
            return Ok(None);
        }
        buffer.extend_from_slice(&chunk[..read]);
        ensure!(buffer.len() < 1 << 20, "request head too large");
    };
    let head = String::from_utf8_lossy(&buffer[..header_end]).into_owned();
    let length = head
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.trim()
                .eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse::<usize>().ok())
                .flatten()
        })
        .unwrap_or(0);
    let mut body = buffer[header_end + 4..].to_vec();
    while body.len() < length {
        let read = stream.read(&mut chunk).await?;
        ensure!(read > 0, "request body cut short");
        body.extend_from_slice(&chunk[..read]);
    }
    // One request per upstream connection: the answer ends when it closes.
    let head: String = head
        .lines()
        .filter(|line| {
            !line
                .split_once(':')
                .is_some_and(|(name, _)| name.trim().eq_ignore_ascii_case("connection"))
        })
        .collect::<Vec<_>>()
        .join("\r\n");
    Ok(Some((format!("{head}\r\nConnection: close\r\n\r\n"), body)))
}

/// Sends `request` upstream on a fresh connection; returns the whole answer.
pub(crate) async fn forward(
    upstream: SocketAddr,
    head: &str,
    body: &[u8],
) -> anyhow::Result<Vec<u8>> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(upstream).await?;
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body).await?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await?;
    Ok(answer)
}

pub(crate) async fn relay(
    mut client: tokio::net::TcpStream,
    state: &ProxyState,
) -> anyhow::Result<()> {
    use tokio::io::AsyncWriteExt as _;
    let Some((head, body)) = read_request(&mut client).await? else {
        return Ok(());
    };
    state.requests.fetch_add(1, Ordering::Relaxed);
    let answer = forward(state.upstream, &head, &body).await?;
    let (lose, again, delay_ms) = {
        let mut rng = state
            .rng
            .lock()
            .map_err(|_| anyhow::anyhow!("rng poisoned"))?;
        (
            rng.random_bool(state.drop_answer),
            rng.random_bool(state.replay),
            rng.random_range(200..3000u64),
        )
    };
    if again {
        state.replays.fetch_add(1, Ordering::Relaxed);
        let upstream = state.upstream;
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(delay_ms)).await;
            let _ = forward(upstream, &head, &body).await;
        });
    }
    if lose {
        // Processed upstream; the sender only sees its connection close.
        state.dropped_answers.fetch_add(1, Ordering::Relaxed);
        return Ok(());
    }
    client.write_all(&answer).await?;
    client.shutdown().await?;
    Ok(())
}

pub(crate) fn upstream(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}
