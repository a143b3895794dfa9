//! The KServe v2 protocol over HTTP/1.1 (keep-alive, pipelining) on hyper. Routes (`{v}` is
//! the one version, `1`):
//!
//! ```text
//! GET  /v2                                        server metadata
//! GET  /v2/health/live, /v2/health/ready          200 or 503
//! GET  /v2/models/{name}[/versions/{v}]           inputs and outputs: datatypes, shapes
//! GET  /v2/models/{name}[/versions/{v}]/ready     200 or 503
//! GET  /v2/models/{name}[/versions/{v}]/config    Triton's model configuration
//! GET  /v2/models[/{name}[/versions/{v}]]/stats   Triton's statistics extension
//! POST /v2/models/{name}[/versions/{v}]/infer     JSON tensors or Triton's binary extension
//! GET  /metrics                                   Prometheus' text format
//! ```
//!
//! Limits before work: headers bounded in size, count and time (431, 408; hyper's, with the
//! 408 written here); a body declared or grown past `max_request_bytes` is a 413, one slower
//! than `body_timeout` a 408; uploads in progress are bounded (503 before the body is read),
//! and a queue place is taken only once a request is complete (503 past `max_queue`); every
//! byte a request holds is counted in the memory budget (it waits for room until its
//! deadline). Health, metadata, config, statistics and metrics take no place and no budget:
//! they are answered however full the server is.
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use http::header::{HeaderValue, CONNECTION, CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE, UPGRADE};
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use crate::error::{client_bytes, client_text, RequestError, Status};
use crate::protocol;
use crate::service::{Model, Service};
use crate::transport::body::{Answer, Unread};

const JSON: &str = "application/json";
const HEADER_LENGTH: &str = "inference-header-content-length";

/// Answers one request of a connection (`unread`: its answers not yet written).
pub async fn handle(
    service: Arc<Service>,
    unread: Arc<Unread>,
    request: Request<Incoming>,
) -> Result<Response<Answer>, Infallible> {
    let began = Instant::now();
    let method = request.method().clone();
    let path = decoded(request.uri().path());
    // How a log line names the request: made only for one.
    let what = || format!("{method} {}", client_text(&path));
    if request.headers().contains_key(UPGRADE) {
        service.metrics.upgrades.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let error = RequestError::bad("upgrading the connection (WebSocket, HTTP/2 over HTTP/1.1) is not supported: send KServe v2 requests over HTTP/1.1, or gRPC to the gRPC port");
        service.failed(None, &error, began, &what());
        unread.linger.store(true, std::sync::atomic::Ordering::Relaxed);
        return Ok(error_response(&service, &error, true));
    }
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let answer = route(&service, &unread, request, &method, &path, &parts, began, &what).await;
    Ok(match answer {
        Ok(response) => response,
        Err((error, close)) => {
            service.failed(None, &error, began, &what());
            error_response(&service, &error, close)
        }
    })
}

type Routed = Result<Response<Answer>, (RequestError, bool)>;

#[allow(clippy::too_many_arguments)]
async fn route(
    service: &Arc<Service>,
    unread: &Arc<Unread>,
    request: Request<Incoming>,
    method: &Method,
    path: &str,
    parts: &[&str],
    began: Instant,
    what: &(dyn Fn() -> String + Sync),
) -> Routed {
    let no_route = || {
        (
            RequestError::new(
                Status::NotFound,
                format!("no route {}: the KServe v2 routes are under /v2", client_text(path)),
            ),
            false,
        )
    };
    match parts {
        ["v2"] => {
            get(method, path)?;
            Ok(json(service, StatusCode::OK, protocol::server_metadata(&service.options.version)))
        }
        ["v2", "health", which @ ("live" | "ready")] => {
            get(method, path)?;
            let up = *which == "live" || service.ready();
            Ok(empty(service, if up { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE }))
        }
        ["metrics"] => {
            get(method, path)?;
            let text = service.metrics.text(&budget_lines(service));
            service.metrics.response(200);
            Ok(Response::builder()
                .header(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")
                .header(CONTENT_LENGTH, text.len())
                .body(Answer::new(vec![Bytes::from(text)]))
                .expect("a valid response"))
        }
        ["v2", "models", "stats"] => {
            get(method, path)?;
            let all: Vec<_> = service.models.iter().map(|m| m.metrics.statistics()).collect();
            Ok(json(service, StatusCode::OK, protocol::model_statistics(&all)))
        }
        ["v2", "models", name, rest @ ..] => {
            let (version, rest) = match rest {
                ["versions", v, rest @ ..] => (Some(*v), rest),
                ["versions"] => return Err(no_route()),
                rest => (None, rest),
            };
            let model = service.model(name, version).map_err(|e| (e, false))?;
            match rest {
                [] => {
                    get(method, path)?;
                    Ok(json(service, StatusCode::OK, protocol::model_metadata(&model.spec)))
                }
                ["ready"] => {
                    get(method, path)?;
                    let up = service.ready();
                    Ok(empty(service, if up { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE }))
                }
                ["config"] => {
                    get(method, path)?;
                    Ok(json(service, StatusCode::OK, protocol::model_config(&model.spec)))
                }
                ["stats"] => {
                    get(method, path)?;
                    Ok(json(service, StatusCode::OK, protocol::model_statistics(&[model.metrics.statistics()])))
                }
                ["infer"] => {
                    if method != Method::POST {
                        return Err((method_error(path, "POST", method), false));
                    }
                    Ok(infer(service, unread, model, request, began, what).await)
                }
                _ => Err(no_route()),
            }
        }
        _ => Err(no_route()),
    }
}

/// An infer request: its body read within its limits, decoded, run, encoded.
async fn infer(
    service: &Service,
    unread: &Arc<Unread>,
    model: &Model,
    request: Request<Incoming>,
    began: Instant,
    what: &(dyn Fn() -> String + Sync),
) -> Response<Answer> {
    match run(service, unread, model, request, began).await {
        Ok(response) => {
            model.metrics.done(began.elapsed());
            service.metrics.response(200);
            response
        }
        Err(Failure::Gone) => {
            service.cancelled(model, began);
            error_response(service, &RequestError::new(Status::BadRequest, "the client left"), true)
        }
        Err(Failure::Error(error, close)) => {
            service.failed(Some(model), &error, began, &what());
            if close {
                unread.linger.store(true, std::sync::atomic::Ordering::Relaxed);
            }
            error_response(service, &error, close)
        }
    }
}

enum Failure {
    /// The client left while its body was arriving.
    Gone,
    /// The answer, and whether the connection closes after it (the body was not read).
    Error(RequestError, bool),
}

impl From<RequestError> for Failure {
    fn from(e: RequestError) -> Self {
        Failure::Error(e, false)
    }
}

async fn run(
    service: &Service,
    unread: &Arc<Unread>,
    model: &Model,
    request: Request<Incoming>,
    began: Instant,
) -> Result<Response<Answer>, Failure> {
    let closing = |e: RequestError| Failure::Error(e, true);
    let (head, body) = request.into_parts();
    let headers = &head.headers;
    if let Some(encoding) = headers.get(CONTENT_ENCODING) {
        let e = encoding.as_bytes();
        if !e.is_empty() && !e.eq_ignore_ascii_case(b"identity") {
            return Err(closing(RequestError::new(
                Status::UnsupportedMediaType,
                format!(
                    "Content-Encoding {} is not supported: send the request uncompressed",
                    client_bytes(e).trim_matches('\'')
                ),
            )));
        }
    }
    let header_length = number(headers.get(HEADER_LENGTH), "Inference-Header-Content-Length")?;
    let declared = number(headers.get(CONTENT_LENGTH), "Content-Length")?;
    let limit = service.options.max_request_bytes;
    if let Some(n) = declared {
        if n > limit {
            return Err(closing(RequestError::new(
                Status::PayloadTooLarge,
                format!("the body has {n} bytes, over the limit of {limit} (max_request_bytes)"),
            )));
        }
    }
    service.accepting(model).map_err(closing)?;
    let deadline = service.deadline(began, None);
    let mut held = service.budget.empty();
    let whose = format!("a request of model '{}'", model.spec.name);
    if let Some(n) = declared {
        held.grow_body(n as u64, deadline, &whose).await.map_err(closing)?;
    }
    let body = read_body(service, body, declared, &mut held, began, deadline, &whose).await?;
    let _queued = service.admit(model)?;
    let mut decoded = protocol::decode_http(&model.spec, &body, header_length)?;
    // What the request holds from here on is taken at once: the tensors decoded into buffers
    // of their own (JSON values) and the run's cost. Where it does not fit now, the decoded
    // tensors are let go while it waits, and decoded again once there is room. Its body stays
    // counted as a body arriving until then (bodies hold half the budget at most).
    let (fresh, sliced) = crate::service::fresh_bytes(&body, &decoded);
    let need = fresh + service.run_bytes(model, &decoded, held.bytes() + fresh);
    if !held.try_grow(need) {
        drop(decoded);
        held.grow(need, deadline, &whose).await?;
        decoded = protocol::decode_http(&model.spec, &body, header_length)?;
    }
    held.arrived();
    if !sliced {
        // Nothing refers to the body any more: it goes now.
        held.shrink(held.bytes().saturating_sub(body.len() as u64));
    }
    drop(body);
    let id = decoded.id.clone();
    let asked = decoded.outputs.clone();
    let outputs = service.infer(model, decoded, began, &mut held).await?;
    let encoded = protocol::encode_http(&model.spec, id.as_deref(), &asked, &outputs)?;
    // The answer holds the binary outputs it sends (not copies) and the JSON it wrote; the
    // outputs not asked for go.
    drop(outputs);
    held.resize(encoded.len() as u64);
    let mut response = Response::builder()
        .header(CONTENT_TYPE, if encoded.header_length.is_some() { "application/octet-stream" } else { JSON })
        .header(CONTENT_LENGTH, encoded.len());
    if let Some(n) = encoded.header_length {
        response = response.header(HEADER_LENGTH, n);
    }
    // The queue place is free once the answer exists (`_queued` ends here): a client slow to
    // read it holds its connection and its bytes in the budget, not a place, and for the
    // write timeout at most.
    Ok(response.body(Answer::counted(encoded.parts, held, Some(unread))).expect("a valid response"))
}

/// How long a body may pause before it counts as an upload in progress.
pub const UPLOAD_GRACE: std::time::Duration = std::time::Duration::from_millis(20);

/// The body, at most `max_request_bytes` (413), within `body_timeout` (408), each chunk of
/// a body without a declared length taken from the budget as it arrives. A body that stops
/// arriving for [`UPLOAD_GRACE`] takes an upload place until it has all come (503 past
/// `max_uploads`); one that comes whole with its headers, or flowing, takes none: uploads
/// left pending never turn away complete requests.
async fn read_body(
    service: &Service,
    mut body: Incoming,
    declared: Option<usize>,
    held: &mut crate::batching::Held,
    began: Instant,
    deadline: Instant,
    whose: &str,
) -> Result<Bytes, Failure> {
    let limit = service.options.max_request_bytes;
    let timeout = service.options.body_timeout;
    let until = began + timeout;
    let mut data = BytesMut::new(); // filled only where the body comes in several chunks
    let mut first: Option<Bytes> = None;
    let mut uploading = None;
    loop {
        let frame = match uploading {
            Some(_) => tokio::time::timeout_at(until.into(), body.frame()).await,
            None => {
                match tokio::time::timeout_at(until.min(Instant::now() + UPLOAD_GRACE).into(), body.frame()).await {
                    Ok(frame) => Ok(frame),
                    Err(_) => {
                        uploading = Some(service.upload_place().map_err(|e| Failure::Error(e, true))?);
                        tokio::time::timeout_at(until.into(), body.frame()).await
                    }
                }
            }
        };
        let frame = match frame {
            Err(_) => {
                return Err(Failure::Error(
                    RequestError::new(
                        Status::RequestTimeout,
                        format!(
                            "the body did not arrive within {} s ({} bytes came)",
                            crate::error::seconds(timeout),
                            data.len()
                        ),
                    ),
                    true,
                ))
            }
            Ok(None) => break,
            Ok(Some(Err(_))) => return Err(Failure::Gone),
            Ok(Some(Ok(frame))) => frame,
        };
        let Ok(chunk) = frame.into_data() else { continue };
        let size = data.len() + first.as_ref().map_or(0, Bytes::len) + chunk.len();
        if size > limit {
            return Err(Failure::Error(
                RequestError::new(
                    Status::PayloadTooLarge,
                    format!("the body is over the limit of {limit} bytes (max_request_bytes)"),
                ),
                true,
            ));
        }
        if declared.is_none() {
            held.grow_body(chunk.len() as u64, deadline, whose).await.map_err(|e| Failure::Error(e, true))?;
        }
        // One chunk (the common case) is kept as it came: no copy.
        match first.take() {
            None if data.is_empty() => first = Some(chunk),
            Some(f) => {
                data.reserve(declared.unwrap_or(0).max(f.len() + chunk.len()));
                data.extend_from_slice(&f);
                data.extend_from_slice(&chunk);
            }
            None => data.extend_from_slice(&chunk),
        }
    }
    Ok(first.unwrap_or_else(|| data.freeze()))
}

fn number(value: Option<&HeaderValue>, name: &str) -> Result<Option<usize>, Failure> {
    let Some(v) = value else { return Ok(None) };
    let b = v.as_bytes();
    if b.is_empty() || b.len() > 18 || !b.iter().all(u8::is_ascii_digit) {
        return Err(Failure::Error(
            RequestError::bad(format!("the {name} header must be a non-negative integer, got {}", client_bytes(b))),
            true,
        ));
    }
    Ok(std::str::from_utf8(b).ok().and_then(|s| s.parse().ok()))
}

fn get(method: &Method, path: &str) -> Result<(), (RequestError, bool)> {
    if method == Method::GET || method == Method::HEAD {
        Ok(())
    } else {
        Err((method_error(path, "GET", method), false))
    }
}

fn method_error(path: &str, allowed: &str, method: &Method) -> RequestError {
    RequestError::new(Status::MethodNotAllowed, format!("{} takes {allowed}, not {method}", client_text(path)))
}

fn json(service: &Service, status: StatusCode, body: Bytes) -> Response<Answer> {
    service.metrics.response(status.as_u16());
    Response::builder()
        .status(status)
        .header(CONTENT_TYPE, JSON)
        .header(CONTENT_LENGTH, body.len())
        .body(Answer::new(vec![body]))
        .expect("a valid response")
}

fn empty(service: &Service, status: StatusCode) -> Response<Answer> {
    service.metrics.response(status.as_u16());
    Response::builder().status(status).header(CONTENT_LENGTH, 0).body(Answer::empty()).expect("a valid response")
}

fn error_response(service: &Service, error: &RequestError, close: bool) -> Response<Answer> {
    let status = StatusCode::from_u16(error.status.http()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = json(service, status, protocol::error_json(&error.message));
    let headers = response.headers_mut();
    if error.status == Status::Unavailable {
        headers.insert("retry-after", HeaderValue::from_static("1"));
    }
    if close {
        headers.insert(CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

fn budget_lines(service: &Service) -> String {
    format!(
        "# HELP fastseq_memory_budget_bytes The server's memory budget for requests\n# TYPE fastseq_memory_budget_bytes gauge\n\
         fastseq_memory_budget_bytes {}\n# HELP fastseq_memory_held_bytes Bytes requests hold now (bodies, tensors, batches, \
         unread answers)\n# TYPE fastseq_memory_held_bytes gauge\nfastseq_memory_held_bytes {}\n\
         # HELP fastseq_open_requests Requests arriving, queued or running\n# TYPE fastseq_open_requests gauge\nfastseq_open_requests {}\n",
        service.budget.limit(),
        service.budget.used(),
        service.open()
    )
}

/// The path with its %XX escapes decoded (bytes that are not UTF-8 shown as U+FFFD).
fn decoded(path: &str) -> String {
    if !path.contains('%') {
        return path.to_string();
    }
    let b = path.as_bytes();
    let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(b.len());
    let mut k = 0;
    while k < b.len() {
        if b[k] == b'%' && k + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[k + 1]), hex(b[k + 2])) {
                out.push(h * 16 + l);
                k += 3;
                continue;
            }
        }
        out.push(b[k]);
        k += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
