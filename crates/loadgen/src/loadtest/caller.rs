//! How a load test sends: a model's request prepared once over either protocol ([`Target`]),
//! and one connection's sender per worker — the loopback HTTP client, or a lean gRPC caller on
//! `h2` directly ([`GrpcCaller`]).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kiln_serve::records::{ModelConfig, ModelMetadata};

use super::request::{grpc_message, grpc_request, request_body};
use super::{LoadtestError, Protocol, pb};
use crate::client::{BaseUrl, ClientError, HttpClient};
use pb::grpc_inference_service_client::GrpcInferenceServiceClient;

/// A prepared request for one protocol.
#[derive(Clone)]
pub(super) enum Target {
    Http {
        addr: std::net::SocketAddr,
        path: Arc<String>,
        body: Arc<Vec<u8>>,
        hlen: Option<String>,
    },
    Grpc {
        uri: String,
        /// The encoded `ModelInferRequest` with its 5-byte gRPC prefix.
        message: Bytes,
    },
}

/// One connection's sending side.
pub(super) enum Sender {
    Http(HttpClient, Arc<String>, Arc<Vec<u8>>, Option<String>),
    Grpc(GrpcCaller),
}

impl Sender {
    /// Send once; `Err` is the error's key in the report (HTTP status, `io`, gRPC code).
    pub(super) async fn send(&mut self) -> Result<(), String> {
        match self {
            Sender::Http(c, path, body, hlen) => {
                let mut headers = vec![("Content-Type", "application/json")];
                if let Some(h) = hlen {
                    headers[0].1 = "application/octet-stream";
                    headers.push(("Inference-Header-Content-Length", h.as_str()));
                }
                match c.request("POST", path, &headers, body).await {
                    Ok(r) if r.status == 200 => Ok(()),
                    Ok(r) => Err(r.status.to_string()),
                    Err(_) => Err("io".into()),
                }
            }
            Sender::Grpc(c) => c.call().await,
        }
    }
}

/// The gRPC path of the request the load loop sends: a unary `ModelInfer` on one HTTP/2
/// connection driven by `h2` directly (no tower stack, no per-call message encoding).
///
/// The message is encoded once, with its 5-byte gRPC prefix, when the run is prepared; each
/// call sends one HEADERS frame (`content-type: application/grpc`, `te: trailers`,
/// `grpc-timeout`) and one DATA frame holding that buffer (a reference-counted clone), in one
/// write (the socket is corked: [`kiln_serve::corked`]), reads the answer's DATA frames and its
/// trailers, and checks `grpc-status` and the answer's framing. The HTTP side's client is
/// equally lean (one prepared body, the status checked, the body read and not parsed), so the
/// two protocols are compared on their transports, not on their client libraries: through
/// tonic's client (tower buffer, a request clone and encode per call) the load generator spent
/// about twice its HTTP client's CPU per call, as much as the server (2-core VM,
/// `benches/README.md`).
pub(super) struct GrpcCaller {
    send: h2::client::SendRequest<Bytes>,
    uri: hyper::Uri,
    body: Bytes,
    timeout: Duration,
    grpc_timeout: hyper::header::HeaderValue,
}

/// The gRPC status code's name as the report keys errors (`grpc_Unavailable`, ...).
pub(super) fn grpc_error_key(status: &[u8]) -> String {
    let code = std::str::from_utf8(status)
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok())
        .map(tonic::Code::from_i32)
        .unwrap_or(tonic::Code::Unknown);
    format!("grpc_{code:?}")
}

impl GrpcCaller {
    async fn connect(uri: &str, body: Bytes, timeout: Duration) -> Result<Self, LoadtestError> {
        let fail = |m: String| LoadtestError::Grpc {
            url: uri.to_string(),
            message: m,
        };
        let base = BaseUrl::parse(uri)?;
        let tcp = tokio::time::timeout(
            Duration::from_secs(10),
            tokio::net::TcpStream::connect(base.addr),
        )
        .await
        .map_err(|_| fail("cannot connect: timed out after 10 s".into()))?
        .map_err(|e| fail(format!("cannot connect: {e}")))?;
        tcp.set_nodelay(true)
            .map_err(|e| fail(format!("cannot set TCP_NODELAY: {e}")))?;
        // Corked (as the server's connections): a call's HEADERS and DATA frames leave in one
        // write, not two.
        let (io, out) = kiln_serve::corked::cork(tcp);
        let (send, conn) = h2::client::Builder::new()
            .initial_window_size(1 << 20)
            .initial_connection_window_size(1 << 24)
            .handshake::<_, Bytes>(io)
            .await
            .map_err(|e| fail(format!("HTTP/2 handshake failed: {e}")))?;
        tokio::spawn(async move {
            let _ = kiln_serve::corked::Corked::new(conn, out).await;
        });
        let path = format!(
            "http://{}/inference.GRPCInferenceService/ModelInfer",
            base.addr
        );
        let uri = path
            .parse()
            .map_err(|e| fail(format!("bad URI {path}: {e}")))?;
        // grpc-timeout: at most 8 digits and a unit; milliseconds cover every sane timeout.
        let ms = timeout.as_millis().clamp(1, 99_999_999);
        let grpc_timeout = hyper::header::HeaderValue::from_str(&format!("{ms}m"))
            .map_err(|e| fail(e.to_string()))?;
        Ok(Self {
            send,
            uri,
            body,
            timeout,
            grpc_timeout,
        })
    }

    /// One call; `Err` is the report's error key (`io`, `http_<status>`, `grpc_<code>`).
    async fn call(&mut self) -> Result<(), String> {
        match tokio::time::timeout(self.timeout, self.exchange()).await {
            Ok(r) => r,
            Err(_) => Err("grpc_DeadlineExceeded".into()),
        }
    }

    async fn exchange(&mut self) -> Result<(), String> {
        use hyper::header::{CONTENT_TYPE, HeaderValue, TE};
        let io = |_| "io".to_string();
        let mut req = hyper::Request::new(());
        *req.method_mut() = hyper::Method::POST;
        *req.uri_mut() = self.uri.clone();
        let h = req.headers_mut();
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        h.insert(TE, HeaderValue::from_static("trailers"));
        h.insert("grpc-timeout", self.grpc_timeout.clone());
        let mut send = self.send.clone().ready().await.map_err(io)?;
        let (resp, mut stream) = send.send_request(req, false).map_err(io)?;
        stream.send_data(self.body.clone(), true).map_err(io)?;
        let resp = resp.await.map_err(io)?;
        if resp.status() != hyper::StatusCode::OK {
            return Err(format!("http_{}", resp.status().as_u16()));
        }
        // A trailers-only answer (an error) carries its status in the headers.
        if let Some(s) = resp.headers().get("grpc-status") {
            return if s.as_bytes() == b"0" {
                Err("grpc_no_message".into())
            } else {
                Err(grpc_error_key(s.as_bytes()))
            };
        }
        let mut body = resp.into_body();
        let (mut prefix, mut got) = ([0u8; 5], 0usize);
        while let Some(chunk) = body.data().await {
            let chunk = chunk.map_err(io)?;
            let _ = body.flow_control().release_capacity(chunk.len());
            for (i, &b) in chunk.iter().enumerate().take(5usize.saturating_sub(got)) {
                prefix[got + i] = b;
            }
            got += chunk.len();
        }
        let trailers = body.trailers().await.map_err(io)?;
        match trailers.as_ref().and_then(|t| t.get("grpc-status")) {
            Some(s) if s.as_bytes() == b"0" => {}
            Some(s) => return Err(grpc_error_key(s.as_bytes())),
            None => return Err("grpc_no_status".into()),
        }
        // One uncompressed message filling the body.
        let len = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
        if got >= 5 && prefix[0] == 0 && 5 + len == got {
            Ok(())
        } else {
            Err("grpc_bad_framing".into())
        }
    }
}

/// A tonic client of the gRPC endpoint (metadata, configuration, statistics).
pub(super) async fn grpc_connect(
    uri: &str,
) -> Result<GrpcInferenceServiceClient<tonic::transport::Channel>, LoadtestError> {
    let fail = |m: String| LoadtestError::Grpc {
        url: uri.to_string(),
        message: m,
    };
    let ep = tonic::transport::Endpoint::from_shared(uri.to_string())
        .map_err(|e| fail(e.to_string()))?
        .connect_timeout(Duration::from_secs(10))
        .tcp_nodelay(true);
    let ch = ep
        .connect()
        .await
        .map_err(|e| fail(format!("cannot connect: {e}")))?;
    Ok(GrpcInferenceServiceClient::new(ch)
        .max_decoding_message_size(usize::MAX)
        .max_encoding_message_size(usize::MAX))
}

impl Target {
    /// A connection sending this request.
    pub(super) async fn sender(&self, timeout: Duration) -> Result<Sender, LoadtestError> {
        Ok(match self {
            Target::Http {
                addr,
                path,
                body,
                hlen,
            } => Sender::Http(
                HttpClient::new(*addr).with_timeout(timeout),
                path.clone(),
                body.clone(),
                hlen.clone(),
            ),
            Target::Grpc { uri, message } => {
                Sender::Grpc(GrpcCaller::connect(uri, message.clone(), timeout).await?)
            }
        })
    }
}

fn unreachable_at(url: &str, source: ClientError) -> LoadtestError {
    LoadtestError::Unreachable {
        url: url.to_string(),
        source: Box::new(source),
    }
}

/// Read a model's metadata and config over HTTP and prepare the request.
pub(super) async fn prepare_http(
    url: &str,
    model: &str,
    batch: usize,
    binary: bool,
) -> Result<Target, LoadtestError> {
    let base = BaseUrl::parse(url)?;
    let model_path = format!("{}/v2/models/{}", base.prefix, model);
    let mut probe = HttpClient::new(base.addr).with_timeout(Duration::from_secs(10));
    let meta = probe
        .get(&model_path)
        .await
        .map_err(|e| unreachable_at(url, e))?;
    if meta.status != 200 {
        return Err(LoadtestError::Metadata {
            path: model_path,
            status: meta.status,
            body: meta.text(),
        });
    }
    let meta: ModelMetadata = meta
        .record()
        .map_err(|e| LoadtestError::BadMetadata(format!("GET {model_path}: {e}")))?;
    // Without a configuration (another server, an older kiln) values are generic.
    let config: Option<ModelConfig> = probe
        .get(&format!("{model_path}/config"))
        .await
        .ok()
        .filter(|r| r.status == 200)
        .and_then(|r| r.record().ok());
    let (body, hlen) = request_body(&meta, config.as_ref(), batch, binary)?;
    Ok(Target::Http {
        addr: base.addr,
        path: Arc::new(format!("{model_path}/infer")),
        body: Arc::new(body),
        hlen: hlen.map(|n| n.to_string()),
    })
}

/// The `http://host:port` of a gRPC endpoint given as a loopback URL (`http://` optional).
pub(super) fn grpc_uri(url: &str) -> Result<String, LoadtestError> {
    let full = if url.contains("://") {
        url.to_string()
    } else {
        format!("http://{url}")
    };
    let base = BaseUrl::parse(&full)?;
    Ok(format!("http://{}", base.addr))
}

/// Read a model's metadata and config over gRPC and prepare the request.
async fn prepare_grpc(
    url: &str,
    model: &str,
    batch: usize,
    binary: bool,
) -> Result<Target, LoadtestError> {
    let uri = grpc_uri(url)?;
    let mut c = grpc_connect(&uri).await?;
    let fail = |s: tonic::Status| LoadtestError::Grpc {
        url: uri.clone(),
        message: format!("model `{model}`: {:?}: {}", s.code(), s.message()),
    };
    let meta = ModelMetadata::from(
        c.model_metadata(pb::ModelMetadataRequest {
            name: model.to_string(),
            version: String::new(),
        })
        .await
        .map_err(fail)?
        .into_inner(),
    );
    let config = c
        .model_config(pb::ModelConfigRequest {
            name: model.to_string(),
            version: String::new(),
        })
        .await
        .ok()
        .and_then(|r| r.into_inner().config)
        .map(|c| ModelConfig::from(&c));
    let request = grpc_request(model, &meta, config.as_ref(), batch, binary)?;
    Ok(Target::Grpc {
        uri,
        message: grpc_message(&request),
    })
}

/// Read a model's metadata and configuration over `protocol` and prepare the request.
pub(super) async fn prepare(
    url: &str,
    model: &str,
    protocol: Protocol,
    batch: usize,
    binary: bool,
) -> Result<Target, LoadtestError> {
    match protocol {
        Protocol::Http => prepare_http(url, model, batch, binary).await,
        Protocol::Grpc => prepare_grpc(url, model, batch, binary).await,
    }
}
