//! The KServe v2 protocol over gRPC: Triton's `inference.GRPCInferenceService` on hyper's
//! HTTP/2, over the same [`Service`] as HTTP (the same models, batching, limits, timeouts
//! and metrics). gRPC is framed here by hand (a flag byte, a 4-byte length, the message), and
//! the messages are `protocol::grpc`'s. Served: ServerLive, ServerReady, ModelReady,
//! ServerMetadata, ModelMetadata, ModelConfig, ModelStatistics and ModelInfer; the others
//! answer UNIMPLEMENTED. Health, metadata, config and statistics take no queue place and no
//! budget: they are answered however full the server is.
use std::borrow::Cow;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use http::header::{HeaderValue, CONTENT_TYPE};
use http::{HeaderMap, Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use prost::Message;
use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::batching::Held;
use crate::error::{client_text, RequestError, Status};
use crate::protocol::grpc as messages;
use crate::service::Service;
use crate::transport::body::{Answer, Unread};
use crate::transport::http::UPLOAD_GRACE;
use crate::transport::socket::Socket;
use crate::transport::{http2, unread_answer, until_stopped};

const PREFIX: &str = "/inference.GRPCInferenceService/";

/// Streams a connection may open beyond `max_queue` and `max_uploads` (see [`serve`]).
pub const STREAMS_BESIDE: usize = 32;

/// Serves one gRPC connection.
pub async fn serve(stream: TcpStream, service: Arc<Service>, mut stopped: watch::Receiver<bool>) {
    let _ = stream.set_nodelay(true);
    let stream = Arc::new(stream);
    let socket = Socket::new(stream, service.options.body_timeout);
    let o = &service.options;
    let mut builder = http2();
    // Streams beyond the queue's and the uploads' places: calls that take none (health,
    // metadata, config, statistics) open even while infer calls fill both.
    let streams = o.max_queue.saturating_add(o.max_uploads).saturating_add(STREAMS_BESIDE);
    builder
        .max_header_list_size(o.max_header_bytes as u32)
        .max_concurrent_streams(streams.min(u32::MAX as usize) as u32)
        .max_send_buf_size(1 << 20)
        // gRPC's own servers send no Date: hyper would stamp each answer with one.
        .auto_date_header(false)
        .keep_alive_interval(Some(Duration::from_secs(30)))
        .keep_alive_timeout(Duration::from_secs(20));
    let unread = Arc::new(Unread::default());
    let handler = {
        let service = service.clone();
        let unread = unread.clone();
        service_fn(move |request| call(service.clone(), unread.clone(), request))
    };
    let connection = builder.serve_connection(TokioIo::new(socket), handler);
    tokio::pin!(connection);
    // An answer its client does not read (its flow-control window kept shut) is never tried
    // on the socket, so the socket's write timeout cannot see it: the connection ends once one
    // has waited for the body timeout, and its answers' bytes go back to the budget.
    let write_timeout = service.options.body_timeout;
    tokio::select! {
        _ = connection.as_mut() => {}
        _ = unread.stalled(write_timeout) => unread_answer(&service),
        _ = until_stopped(&mut stopped) => {
            connection.as_mut().graceful_shutdown();
            tokio::select! {
                _ = connection.as_mut() => {}
                _ = unread.stalled(write_timeout) => unread_answer(&service),
            }
        }
    }
}

async fn call(
    service: Arc<Service>,
    unread: Arc<Unread>,
    request: Request<Incoming>,
) -> Result<Response<Answer>, Infallible> {
    let began = Instant::now();
    let Some(method) = request.uri().path().strip_prefix(PREFIX) else {
        let e = RequestError::new(
            Status::MethodNotAllowed,
            format!("no gRPC service at {}", client_text(request.uri().path())),
        );
        return Ok(failure(&e));
    };
    // ModelInfer, the call made per request, is named without formatting anything.
    let infer_call = method == "ModelInfer";
    let what: Cow<str> =
        if infer_call { "gRPC ModelInfer".into() } else { format!("gRPC {}", client_text(method)).into() };
    let method = if infer_call { String::new() } else { method.to_string() };
    let grpc_type = request.headers().get(CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
    if !grpc_type {
        let e = RequestError::bad("a gRPC request's content-type is application/grpc");
        service.failed(None, &e, began, &what);
        return Ok(failure(&e));
    }
    let deadline = grpc_deadline(request.headers()).map(|d| began + d);
    let answer = if infer_call {
        infer(&service, &unread, request, began, deadline, &what).await
    } else {
        other(&service, &method, request).await
    };
    Ok(match answer {
        Ok(response) => response,
        Err(e) => {
            if !infer_call {
                service.failed(None, &e, began, &what);
            }
            failure(&e)
        }
    })
}

/// Everything but ModelInfer: small messages, answered at once.
async fn other(service: &Service, method: &str, request: Request<Incoming>) -> Result<Response<Answer>, RequestError> {
    const SMALL: usize = 64 << 10;
    let until = Instant::now() + service.options.body_timeout;
    let body = read(request.into_body(), SMALL, until, None, Instant::now()).await?;
    if body.len() > SMALL {
        return Err(RequestError::new(
            Status::PayloadTooLarge,
            format!("{} takes a message of {SMALL} bytes at most", client_text(method)),
        ));
    }
    let name_of = |name: &str| -> Result<(), RequestError> {
        if name.is_empty() {
            return Err(RequestError::bad("the request needs a model's name"));
        }
        Ok(())
    };
    let version_of = |v: &str| -> Option<String> { (!v.is_empty()).then(|| v.to_string()) };
    Ok(match method {
        "ServerLive" => reply(&messages::ServerLiveResponse { live: true }),
        "ServerReady" => reply(&messages::ServerReadyResponse { ready: service.ready() }),
        "ModelReady" => {
            let m = decode::<messages::ModelReadyRequest>(&body)?;
            name_of(&m.name)?;
            service.model(&m.name, version_of(&m.version).as_deref())?;
            reply(&messages::ModelReadyResponse { ready: service.ready() })
        }
        "ServerMetadata" => reply(&messages::server_metadata(&service.options.version)),
        "ModelMetadata" => {
            let m = decode::<messages::ModelMetadataRequest>(&body)?;
            name_of(&m.name)?;
            let model = service.model(&m.name, version_of(&m.version).as_deref())?;
            reply(&messages::model_metadata(&model.spec))
        }
        "ModelConfig" => {
            let m = decode::<messages::ModelConfigRequest>(&body)?;
            name_of(&m.name)?;
            let model = service.model(&m.name, version_of(&m.version).as_deref())?;
            reply(&messages::model_config(&model.spec))
        }
        "ModelStatistics" => {
            let m = decode::<messages::ModelStatisticsRequest>(&body)?;
            let stats: Vec<_> = if m.name.is_empty() {
                service.models.iter().map(|m| m.metrics.statistics()).collect()
            } else {
                vec![service.model(&m.name, version_of(&m.version).as_deref())?.metrics.statistics()]
            };
            reply(&messages::model_statistics(&stats))
        }
        other => {
            return Err(RequestError::new(
                Status::MethodNotAllowed,
                format!("{} is not served by fastseq serve", client_text(other)),
            ))
        }
    })
}

async fn infer(
    service: &Service,
    unread: &Arc<Unread>,
    request: Request<Incoming>,
    began: Instant,
    deadline: Option<Instant>,
    what: &str,
) -> Result<Response<Answer>, RequestError> {
    let fail = |e: RequestError| {
        service.failed(None, &e, began, what);
        e
    };
    let mut held = service.budget.empty();
    // The model is named inside the message: it is read first, bounded and counted.
    let limit = service.options.max_request_bytes;
    let until = (began + service.options.body_timeout).min(deadline.unwrap_or(began + service.options.body_timeout));
    let counted = Counting { held: &mut held, deadline: service.deadline(began, None), service };
    let body = read(request.into_body(), limit, until, Some(counted), began).await.map_err(fail)?;
    // What prost will allocate is taken before it does (an empty input is 2 bytes on the
    // wire and a few hundred decoded).
    let cost = messages::cost::decoded_cost(&body);
    held.grow(cost, service.deadline(began, None), "a gRPC request, decoded,").await.map_err(fail)?;
    let message = decode::<messages::ModelInferRequest>(&body).map_err(fail)?;
    let version = (!message.model_version.is_empty()).then(|| message.model_version.clone());
    let model = service.model(&message.model_name, version.as_deref()).map_err(fail)?;
    let result = async {
        let _queued = service.admit(model)?;
        let mut decoded = messages::decode_infer(&model.spec, message)?;
        // The message is gone: the request holds its tensors (slices of the body, or buffers
        // of their own from typed contents), and takes its run's cost.
        let (fresh, sliced) = crate::service::fresh_bytes(&body, &decoded);
        held.resize(fresh + if sliced { body.len() as u64 } else { 0 });
        drop(body);
        let run = service.run_bytes(model, &decoded, held.bytes());
        if !held.try_grow(run) {
            let whose = format!("a request of model '{}'", model.spec.name);
            held.grow(run, service.deadline(began, Some(&decoded)), &whose).await?;
        }
        held.arrived();
        if let Some(d) = deadline {
            let left = d.saturating_duration_since(began);
            decoded.timeout = Some(decoded.timeout.map_or(left, |t| t.min(left)));
        }
        let id = decoded.id.clone();
        let asked = decoded.outputs.clone();
        let outputs = service.infer(model, decoded, began, &mut held).await?;
        let response = messages::encode_infer(&model.spec, id.as_deref(), &asked, &outputs);
        drop(outputs);
        Ok::<_, RequestError>(response)
    }
    .await;
    match result {
        Ok(response) => {
            let framed = frame(&response);
            drop(response);
            held.resize(framed.len() as u64);
            model.metrics.done(began.elapsed());
            Ok(ok(Answer::counted(vec![framed], held, Some(unread))))
        }
        Err(e) => {
            service.failed(Some(model), &e, began, what);
            Err(e)
        }
    }
}

/// Where a request's bytes are counted as they arrive: its account, its deadline, and the
/// service whose upload places a body still arriving takes.
struct Counting<'a> {
    held: &'a mut Held,
    deadline: Instant,
    service: &'a Service,
}

/// A request's message bytes (the frame's payload): at most `limit` bytes, within `until`,
/// counted as they arrive where `counting` is given (taking an upload place once the body
/// stops arriving for [`UPLOAD_GRACE`]: a 503 past `max_uploads`).
async fn read(
    mut body: Incoming,
    limit: usize,
    until: Instant,
    mut counting: Option<Counting<'_>>,
    began: Instant,
) -> Result<Bytes, RequestError> {
    let mut data = BytesMut::new();
    let mut uploading = None;
    loop {
        let frame = match (uploading.is_some(), counting.as_ref()) {
            (false, Some(c)) => {
                match tokio::time::timeout_at(until.min(Instant::now() + UPLOAD_GRACE).into(), body.frame()).await {
                    Ok(frame) => Ok(frame),
                    Err(_) => {
                        uploading = Some(c.service.upload_place()?);
                        tokio::time::timeout_at(until.into(), body.frame()).await
                    }
                }
            }
            _ => tokio::time::timeout_at(until.into(), body.frame()).await,
        };
        let frame = match frame {
            Err(_) => {
                return Err(RequestError::new(
                    Status::RequestTimeout,
                    format!("the request did not arrive within {} s", crate::error::seconds(until - began)),
                ))
            }
            Ok(None) => break,
            Ok(Some(Err(_))) => return Err(RequestError::bad("the request's stream was reset")),
            Ok(Some(Ok(frame))) => frame,
        };
        let Ok(chunk) = frame.into_data() else { continue };
        if data.len() + chunk.len() > limit + 5 {
            return Err(RequestError::new(
                Status::PayloadTooLarge,
                format!("the request is over the limit of {limit} bytes (max_request_bytes)"),
            ));
        }
        if let Some(c) = counting.as_mut() {
            c.held.grow_body(chunk.len() as u64, c.deadline, "a gRPC request").await?;
        }
        data.extend_from_slice(&chunk);
    }
    drop(uploading);
    if data.len() < 5 {
        return Err(RequestError::bad("a gRPC request needs its 5-byte frame header and a message"));
    }
    if data[0] != 0 {
        return Err(RequestError::new(
            Status::UnsupportedMediaType,
            "compressed gRPC messages are not supported: send them uncompressed",
        ));
    }
    let length = u32::from_be_bytes([data[1], data[2], data[3], data[4]]) as usize;
    if length != data.len() - 5 {
        return Err(RequestError::bad(format!(
            "the gRPC frame says {length} bytes, but {} came (one message a call)",
            data.len() - 5
        )));
    }
    Ok(data.freeze().slice(5..))
}

fn decode<M: Message + Default>(body: &Bytes) -> Result<M, RequestError> {
    M::decode(body.clone())
        .map_err(|e| RequestError::bad(format!("the request is not a valid message: {}", client_text(&e.to_string()))))
}

/// A message framed for gRPC: the flag byte (not compressed), its length, its bytes.
fn frame<M: Message>(message: &M) -> Bytes {
    let len = message.encoded_len();
    let mut buf = BytesMut::with_capacity(len + 5);
    buf.put_u8(0);
    buf.put_u32(len as u32);
    message.encode(&mut buf).expect("room for the message");
    buf.freeze()
}

fn reply<M: Message>(message: &M) -> Response<Answer> {
    ok(Answer::new(vec![frame(message)]))
}

fn ok(body: Answer) -> Response<Answer> {
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    Response::builder()
        .header(CONTENT_TYPE, "application/grpc")
        .body(body.with_trailers(trailers))
        .expect("a valid response")
}

/// A failure as gRPC answers it: headers only, its status and message in them.
fn failure(error: &RequestError) -> Response<Answer> {
    Response::builder()
        .header(CONTENT_TYPE, "application/grpc")
        .header("grpc-status", error.status.grpc())
        .header("grpc-message", percent(&error.message))
        .body(Answer::empty())
        .expect("a valid response")
}

/// gRPC's percent-encoding of a status message (what is not printable ASCII, and '%').
fn percent(message: &str) -> HeaderValue {
    let mut out = String::with_capacity(message.len());
    for b in message.bytes() {
        if (0x20..0x7f).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    HeaderValue::from_str(&out).unwrap_or_else(|_| HeaderValue::from_static("failed"))
}

/// The call's own deadline (`grpc-timeout`: digits and a unit, H M S m u n).
fn grpc_deadline(headers: &HeaderMap) -> Option<Duration> {
    let v = headers.get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = v.split_at(v.len().checked_sub(1)?);
    let n: u64 = digits.parse().ok().filter(|_| digits.len() <= 8)?;
    Some(match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}
