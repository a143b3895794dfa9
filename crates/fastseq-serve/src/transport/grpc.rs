//! (being written: gRPC on HTTP/2)
use std::sync::Arc;

use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::service::Service;

pub async fn serve(_stream: TcpStream, _service: Arc<Service>, _stopped: watch::Receiver<bool>) {}
