//! The transports: HTTP/1.1 ([`http`]) and gRPC on HTTP/2 ([`grpc`]) on a tokio runtime of
//! the server's own, over one [`Service`]. [`Server`] owns the runtime, the listening sockets
//! and the connections: started from sockets bound by the caller (so a port of 0 is known
//! before anything runs), stopped by a drain that answers the requests open, then closes.
pub mod body;
pub mod grpc;
pub mod http;
pub mod socket;

use std::net::TcpListener as StdListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::service::Service;
use crate::transport::socket::Socket;

/// What a running server is: its runtime, its ports, how to stop it.
pub struct Server {
    service: Arc<Service>,
    runtime: Mutex<Option<tokio::runtime::Runtime>>,
    stop: watch::Sender<bool>,
    connections: Arc<AtomicUsize>,
    listeners: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

/// The HTTP/1 connection settings: limits before work.
fn http1(service: &Service) -> hyper::server::conn::http1::Builder {
    let o = &service.options;
    let mut b = hyper::server::conn::http1::Builder::new();
    b.timer(TokioTimer::new())
        .header_read_timeout(o.header_timeout)
        .max_headers(o.max_headers)
        .max_header_size(o.max_header_bytes)
        .max_buf_size(o.max_header_bytes.max(8192) * 2)
        .keep_alive(true);
    // Not `pipeline_flush`: it makes hyper copy each answer whole into its own write buffer
    // (its "flatten" strategy, and every body polled at once whatever the buffer holds), where
    // the memory budget no longer sees it: an unread 8 MB answer was 8 MB uncounted. Without
    // it hyper queues the answer's slices (body::CHUNK) as they are and asks for more only as
    // it writes.
    b
}

impl Server {
    /// Serves `service` over HTTP on `http` and, if given, gRPC on `grpc`, on a runtime of
    /// `threads` threads (0: one per core this process may use).
    pub fn start(
        service: Arc<Service>,
        http: StdListener,
        grpc: Option<StdListener>,
        threads: usize,
    ) -> std::io::Result<Server> {
        let threads = if threads == 0 { std::thread::available_parallelism().map_or(1, |n| n.get()) } else { threads };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("fastseq-serve")
            .enable_all()
            .build()?;
        let (stop, stopped) = watch::channel(false);
        let connections = Arc::new(AtomicUsize::new(0));
        let mut listeners = Vec::new();
        let _entered = runtime.enter();
        http.set_nonblocking(true)?;
        let http = TcpListener::from_std(http)?;
        listeners.push(runtime.spawn(accept(http, service.clone(), stopped.clone(), connections.clone(), Kind::Http)));
        if let Some(grpc) = grpc {
            grpc.set_nonblocking(true)?;
            let grpc = TcpListener::from_std(grpc)?;
            listeners.push(runtime.spawn(accept(grpc, service.clone(), stopped, connections.clone(), Kind::Grpc)));
        }
        drop(_entered);
        Ok(Server { service, runtime: Mutex::new(Some(runtime)), stop, connections, listeners: Mutex::new(listeners) })
    }

    pub fn service(&self) -> &Arc<Service> {
        &self.service
    }

    /// Stops taking connections and requests (ready turns false); open requests go on, and
    /// each connection closes once its requests are answered.
    pub fn drain(&self) {
        self.service.drain();
        let _ = self.stop.send(true);
    }

    /// Drains, waits up to `grace` for the open requests and connections, then closes the
    /// batchers (which run what they took) and the runtime. True where everything ended in time.
    pub fn shutdown(&self, grace: Duration) -> bool {
        self.drain();
        let until = Instant::now() + grace;
        let mut clean = false;
        while Instant::now() < until {
            if self.service.open() == 0 && self.connections.load(Ordering::Acquire) == 0 {
                clean = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        for h in self.listeners.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
            h.abort();
        }
        self.service.close();
        if let Some(rt) = self.runtime.lock().unwrap_or_else(|e| e.into_inner()).take() {
            rt.shutdown_timeout(Duration::from_millis(100));
        }
        clean
    }
}

/// Returns once the server is told to stop.
pub(crate) async fn until_stopped(stopped: &mut watch::Receiver<bool>) {
    let _ = stopped.wait_for(|s| *s).await;
}

#[derive(Clone, Copy)]
enum Kind {
    Http,
    Grpc,
}

async fn accept(
    listener: TcpListener,
    service: Arc<Service>,
    mut stopped: watch::Receiver<bool>,
    connections: Arc<AtomicUsize>,
    kind: Kind,
) {
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                // Out of file descriptors, say: wait a moment rather than spin.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
            _ = until_stopped(&mut stopped) => return,
        };
        connections.fetch_add(1, Ordering::AcqRel);
        let service = service.clone();
        let stopped = stopped.clone();
        let connections = connections.clone();
        tokio::spawn(async move {
            match kind {
                Kind::Http => serve_http(stream, service, stopped).await,
                Kind::Grpc => grpc::serve(stream, service, stopped).await,
            }
            connections.fetch_sub(1, Ordering::AcqRel);
        });
    }
}

async fn serve_http(stream: TcpStream, service: Arc<Service>, mut stopped: watch::Receiver<bool>) {
    let _ = stream.set_nodelay(true);
    let stream = Arc::new(stream);
    let refusals = Arc::new(socket::Refusals::new(service.options.max_header_bytes, service.options.max_headers));
    let socket = Socket::http1(stream.clone(), service.options.body_timeout, refusals.clone());
    let unread = Arc::new(body::Unread::default());
    let handler = {
        let service = service.clone();
        let unread = unread.clone();
        service_fn(move |request| http::handle(service.clone(), unread.clone(), request))
    };
    let connection = http1(&service).serve_connection(TokioIo::new(socket), handler);
    tokio::pin!(connection);
    let write_timeout = service.options.body_timeout;
    let result = tokio::select! {
        r = connection.as_mut() => r,
        _ = unread.stalled(write_timeout) => return unread_answer(&service),
        _ = until_stopped(&mut stopped) => {
            connection.as_mut().graceful_shutdown();
            tokio::select! {
                r = connection.as_mut() => r,
                _ = unread.stalled(write_timeout) => return unread_answer(&service),
            }
        }
    };
    let said = refusals.said.load(Ordering::Relaxed);
    if said > 0 {
        // hyper's answer to a request it could not parse, said as ours: counted and logged
        service.metrics.response(said);
        service.say(
            false,
            &format!(
                "a request hyper could not read as HTTP/1.1 (its headers over their limits, or not HTTP/1.1): {said}"
            ),
        );
    }
    if said > 0 || unread.linger.load(Ordering::Relaxed) {
        // hyper closes after its refusal with the client's bytes unread: without reading them
        // first the close is a reset, and the client may never see the answer.
        linger(&stream, service.options.max_request_bytes).await;
    }
    if let Err(e) = result {
        if e.is_timeout() {
            // hyper closes a connection whose headers did not arrive in time; say why first.
            let body = crate::protocol::error_json(&format!(
                "the request's headers did not arrive within {} s",
                crate::error::seconds(service.options.header_timeout)
            ));
            let head = format!(
                "HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            );
            let _ = stream.try_write(&[head.as_bytes(), &body].concat());
            service.metrics.response(408);
            service.say(false, "a connection's request headers did not arrive in time: 408");
        }
    }
}

/// How long a connection that refused a body before reading it goes on reading (and
/// dropping) what the client still sends, before it closes.
pub const LINGER: Duration = Duration::from_secs(2);

/// Reads and drops what the client still sends, up to `most` bytes, for [`LINGER`] at most or
/// until it closes: closing a socket with bytes unread resets the connection, and the client,
/// still sending its body, would see the reset rather than its answer.
async fn linger(stream: &TcpStream, most: usize) {
    let until = tokio::time::Instant::now() + LINGER;
    let mut buf = vec![0u8; 64 << 10];
    let mut read = 0;
    while read <= most {
        match tokio::time::timeout_at(until, stream.readable()).await {
            Ok(Ok(())) => {}
            _ => return,
        }
        match stream.try_read(&mut buf) {
            Ok(0) => return,
            Ok(n) => read += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => return,
        }
    }
}

/// A connection ended because an answer of it went unread for the write timeout (its bytes
/// go back to the memory budget as it closes).
pub(crate) fn unread_answer(service: &Service) {
    service.say(
        false,
        &format!(
            "a connection's answer was not read within {} s (body_timeout): the connection is closed",
            crate::error::seconds(service.options.body_timeout)
        ),
    );
}

/// Serves `service` on gRPC connections with hyper's HTTP/2 (used by [`grpc`]).
pub(crate) fn http2() -> hyper::server::conn::http2::Builder<TokioExecutor> {
    let mut b = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    b.timer(TokioTimer::new());
    b
}
