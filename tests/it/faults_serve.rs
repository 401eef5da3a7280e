//! The serving half of the fault campaign (issue 16), against the real `kiln serve` binary on
//! a tiny checkpoint trained in-process: slow clients, malformed requests (a corpus plus a
//! seeded generator of mutated requests), the connection cap, overload, and a reload storm.
//!
//! The default run is the reduced form CI runs (well under a minute). The full campaign is
//!
//! ```text
//! KILN_FAULTS_FULL=1 cargo test --release --test it faults_serve:: -- --nocapture
//! ```
//!
//! (`KILN_FAULTS_SEED=N` changes the generator's seed.) Each test prints one
//! `faults_serve: <fault>: ...` line with the cases tried and the failures.

use crate::common::copy_dir;
use crate::common::trained;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kiln::artifact::{Checkpoint, MANIFEST_FILE, WEIGHTS_FILE};
use kiln::infer::build_engine;
use kiln::loadgen::client::HttpClient;
use kiln::predict::Predictor;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const ENGINE: &str = "burn";
const F: usize = 10;

/// Whether the full campaign runs (`KILN_FAULTS_FULL=1`).
fn full() -> bool {
    std::env::var("KILN_FAULTS_FULL").is_ok_and(|v| v == "1")
}

/// `reduced` in CI, `full` in the full campaign.
fn count(reduced: usize, full_n: usize) -> usize {
    if full() { full_n } else { reduced }
}

fn seed() -> u64 {
    std::env::var("KILN_FAULTS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(16)
}

// ---------------------------------------------------------------------------------------------
// A trained checkpoint and a repository (as in tests/it/serve.rs).
// ---------------------------------------------------------------------------------------------

/// The tiny model of this binary (trained once).
/// A repository holding `tiny/1` (the trained model).
fn repository() -> tempfile::TempDir {
    crate::common::repository_of(trained())
}

/// Export a variant of the trained model (biases shifted by `shift`) as `dest`.
fn export_variant(dest: &Path, shift: f32) {
    let ckpt = Checkpoint::load(trained()).unwrap();
    let mut w = ckpt.weights.clone();
    for b in &mut w.mean_head.b {
        *b += shift;
    }
    kiln::artifact::export(dest, ckpt.manifest.clone(), &w).unwrap();
}

fn predictor(dir: &Path) -> Predictor {
    let ckpt = Checkpoint::load(dir).unwrap();
    let engine = build_engine(ENGINE.parse().unwrap(), &ckpt.weights, 1).unwrap();
    Predictor::for_checkpoint(&ckpt, engine)
}

/// `n` deterministic rows of raw features around the training means.
fn rows(n: usize, seed: u32) -> Vec<f32> {
    crate::common::rows_around_means(trained(), n, seed)
}

fn infer_body(x: &[f32]) -> Value {
    json!({"inputs": [{"name": "features", "datatype": "FP32", "shape": [x.len() / F, F], "data": x}]})
}

/// The `mean` output of a JSON answer.
fn mean_of(v: &Value) -> Vec<f32> {
    let out = v["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["name"] == "mean")
        .unwrap();
    out["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The `kiln serve` process.
// ---------------------------------------------------------------------------------------------

struct Server {
    child: Child,
    addr: SocketAddr,
    log: Arc<Mutex<Vec<String>>>,
}

impl Server {
    /// Start `kiln serve` on `repo` with `extra` flags and wait until it is ready.
    async fn start(repo: &Path, extra: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
            .args(["serve", "--repository"])
            .arg(repo)
            .args([
                "--port",
                "0",
                "--grpc-port",
                "0",
                "--engine",
                ENGINE,
                "--instances",
                "1",
            ])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let lines = log.clone();
        // Keep draining stderr for the server's whole life (a full pipe would block it).
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(i) = line.find("http://") {
                    let rest = &line[i + 7..];
                    let end = rest.find(' ').unwrap_or(rest.len());
                    if let Ok(a) = rest[..end].parse::<SocketAddr>() {
                        let _ = tx.send(a);
                    }
                }
                lines.lock().unwrap().push(line);
            }
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("kiln serve printed its address");
        let server = Server { child, addr, log };
        let mut c = HttpClient::new(addr).with_timeout(Duration::from_secs(5));
        let t0 = Instant::now();
        while c.get("/v2/health/ready").await.map(|r| r.status).ok() != Some(200) {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "server not ready: {}",
                server.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        server
    }

    fn client(&self) -> HttpClient {
        HttpClient::new(self.addr).with_timeout(Duration::from_secs(20))
    }

    fn log_tail(&self) -> String {
        let log = self.log.lock().unwrap();
        log[log.len().saturating_sub(20)..].join("\n")
    }

    /// The process is still running (no crash).
    fn assert_alive(&mut self) {
        assert!(
            self.child.try_wait().unwrap().is_none(),
            "kiln serve exited: {}",
            self.log_tail()
        );
    }

    /// Open file descriptors of the server process (Linux), if known.
    fn open_fds(&self) -> Option<usize> {
        std::fs::read_dir(format!("/proc/{}/fd", self.child.id()))
            .ok()
            .map(|d| d.count())
    }

    /// SIGTERM, then the exit status.
    fn stop(mut self) -> Option<i32> {
        // SAFETY: signalling our own child process.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let t0 = Instant::now();
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s.code();
            }
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "kiln serve did not exit after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn health(c: &mut HttpClient) -> u16 {
    c.get("/v2/health/ready")
        .await
        .map(|r| r.status)
        .unwrap_or(0)
}

// ---------------------------------------------------------------------------------------------
// Raw HTTP: send bytes, read back whatever responses come, check each is well formed.
// ---------------------------------------------------------------------------------------------

/// One parsed response.
#[derive(Debug)]
struct Raw {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Raw {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Empty when the response obeys the rules: a 4xx carries `{"error": "..."}`, a 5xx a
    /// JSON object; otherwise why not.
    fn problems(&self) -> Option<String> {
        if self.status < 400 {
            return None;
        }
        let ct = self.header("content-type").unwrap_or("");
        if !ct.starts_with("application/json") {
            return Some(format!(
                "status {} with content-type {ct:?} and body {:?}",
                self.status,
                String::from_utf8_lossy(&self.body)
            ));
        }
        match serde_json::from_slice::<Value>(&self.body) {
            Ok(v) if self.status >= 500 && v.is_object() => None,
            Ok(v) if v["error"].as_str().is_some_and(|e| !e.is_empty()) => None,
            _ => Some(format!(
                "status {} with body {:?}; expected {{\"error\": ...}}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )),
        }
    }
}

/// What one connection gave back.
#[derive(Debug)]
struct Exchange {
    /// Every final response, in order.
    responses: Vec<Raw>,
    /// Why the byte stream is not a sequence of well-formed responses, if it is not.
    malformed: Option<String>,
    /// The connection stayed open past the deadline.
    hung: bool,
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Parse one response from the front of `buf`: `Ok(Some((response, used)))`, `Ok(None)` when
/// more bytes are needed, `Err` when it is not HTTP.
fn parse_response(buf: &[u8], head_request: bool) -> Result<Option<(Raw, usize)>, String> {
    let Some(end) = find(buf, b"\r\n\r\n") else {
        if buf.len() > 64 * 1024 {
            return Err("a response head over 64 KiB".into());
        }
        if !buf.is_empty() && !b"HTTP/1."[..buf.len().min(7)].eq(&buf[..buf.len().min(7)]) {
            return Err(format!(
                "not an HTTP response: {:?}",
                String::from_utf8_lossy(&buf[..buf.len().min(60)])
            ));
        }
        return Ok(None);
    };
    let head = std::str::from_utf8(&buf[..end]).map_err(|_| "response head is not UTF-8")?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or("");
    let status = match status_line.split(' ').collect::<Vec<_>>()[..] {
        [v, code, ..] if v == "HTTP/1.1" || v == "HTTP/1.0" => code
            .parse::<u16>()
            .ok()
            .filter(|c| (100..600).contains(c))
            .ok_or_else(|| format!("bad status line {status_line:?}"))?,
        _ => return Err(format!("bad status line {status_line:?}")),
    };
    let mut headers = Vec::new();
    for l in lines {
        let (k, v) = l
            .split_once(':')
            .ok_or_else(|| format!("bad header line {l:?}"))?;
        headers.push((k.trim().to_string(), v.trim().to_string()));
    }
    let mut r = Raw {
        status,
        headers,
        body: Vec::new(),
    };
    let body_start = end + 4;
    if (100..200).contains(&status) || status == 204 || status == 304 || head_request {
        return Ok(Some((r, body_start)));
    }
    if r.header("transfer-encoding")
        .is_some_and(|t| t.contains("chunked"))
    {
        return Err("chunked responses are not expected from kiln".into());
    }
    let len: usize = r
        .header("content-length")
        .ok_or("a response without content-length")?
        .parse()
        .map_err(|_| "a bad content-length in a response")?;
    if buf.len() < body_start + len {
        return Ok(None);
    }
    r.body = buf[body_start..body_start + len].to_vec();
    Ok(Some((r, body_start + len)))
}

/// Send `request` on a new connection and read responses until the server closes it or
/// `limit` passes.
async fn exchange(addr: SocketAddr, request: &[u8], limit: Duration) -> Exchange {
    let mut out = Exchange {
        responses: Vec::new(),
        malformed: None,
        hung: false,
    };
    let Ok(s) = TcpStream::connect(addr).await else {
        out.malformed = Some("cannot connect".into());
        return out;
    };
    let head_request = request.starts_with(b"HEAD ");
    let (mut rd, mut wr) = s.into_split();
    let request = request.to_vec();
    // The server may answer and close before everything is written.
    let writer = tokio::spawn(async move {
        let _ = wr.write_all(&request).await;
        wr
    });
    let mut buf = Vec::new();
    let deadline = tokio::time::Instant::now() + limit;
    let mut chunk = vec![0u8; 64 * 1024];
    'read: loop {
        match tokio::time::timeout_at(deadline, rd.read(&mut chunk)).await {
            Err(_) => {
                out.hung = true;
                break;
            }
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
        }
        loop {
            match parse_response(&buf, head_request) {
                Ok(Some((r, used))) => {
                    buf.drain(..used);
                    if r.status >= 200 {
                        out.responses.push(r);
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    out.malformed = Some(e);
                    break 'read;
                }
            }
        }
    }
    if !buf.is_empty() && out.malformed.is_none() {
        out.malformed = Some(format!(
            "the connection closed inside a response: {:?}",
            String::from_utf8_lossy(&buf[..buf.len().min(80)])
        ));
    }
    writer.abort();
    out
}

// ---------------------------------------------------------------------------------------------
// Slow clients.
// ---------------------------------------------------------------------------------------------

/// Connections that trickle their headers a byte at a time, and connections that never
/// finish their body, are closed by the header and body timeouts (the body one with a 408
/// JSON answer); the server answers other clients meanwhile and its descriptors go back down.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slow_clients_are_disconnected_and_others_are_served() {
    let n = count(40, 300);
    let repo = repository();
    let mut srv = Server::start(
        repo.path(),
        &["--header-timeout-ms", "1000", "--body-timeout-ms", "1000"],
    )
    .await;
    let addr = srv.addr;
    let fds_before = srv.open_fds();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..n {
        tasks.spawn(async move {
            let t0 = Instant::now();
            let mut s = TcpStream::connect(addr).await.unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            if i % 2 == 0 {
                // Headers, one byte every 100 ms, never finished.
                s.write_all(b"GET /v2/health/live HTTP/1.1\r\nHost: kiln\r\n")
                    .await
                    .unwrap();
                loop {
                    if t0.elapsed() > Duration::from_secs(60) {
                        return Err(format!("trickling connection {i} still open after 60 s"));
                    }
                    if s.write_all(b"x").await.is_err() {
                        break;
                    }
                    match tokio::time::timeout(Duration::from_millis(100), s.read(&mut buf)).await {
                        Ok(Ok(0)) | Ok(Err(_)) => break,
                        Ok(Ok(k)) => got.extend_from_slice(&buf[..k]),
                        Err(_) => {}
                    }
                }
                Ok((true, got))
            } else {
                // A body that never comes.
                s.write_all(
                    b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: kiln\r\nContent-Type: \
                      application/json\r\nContent-Length: 1000\r\n\r\n{\"inputs\": [",
                )
                .await
                .unwrap();
                loop {
                    match tokio::time::timeout(Duration::from_secs(60), s.read(&mut buf)).await {
                        Ok(Ok(0)) | Ok(Err(_)) => break,
                        Ok(Ok(k)) => got.extend_from_slice(&buf[..k]),
                        Err(_) => {
                            return Err(format!(
                                "stalled-body connection {i} still open after 60 s"
                            ));
                        }
                    }
                }
                Ok((false, got))
            }
        });
    }
    // Meanwhile other clients are answered.
    let mut c = srv.client();
    let x = rows(2, 1);
    let (mut checks, mut failures) = (0usize, Vec::new());
    let mut results = Vec::new();
    loop {
        tokio::select! {
            r = tasks.join_next() => match r {
                Some(r) => results.push(r.unwrap()),
                None => break,
            },
            _ = tokio::time::sleep(Duration::from_millis(50)) => {
                checks += 1;
                let h = health(&mut c).await;
                let r = c.post_json("/v2/models/tiny/infer", &infer_body(&x)).await;
                let s = r.as_ref().map(|r| r.status).unwrap_or(0);
                if h != 200 || s != 200 {
                    failures.push(format!("health {h}, infer {s}"));
                }
            }
        }
    }
    let mut bad = Vec::new();
    for r in results {
        match r {
            Err(e) => bad.push(e),
            Ok((true, got)) if !got.is_empty() => bad.push(format!(
                "a trickling client was sent {:?}",
                String::from_utf8_lossy(&got)
            )),
            Ok((true, _)) => {}
            Ok((false, got)) => match parse_response(&got, false) {
                Ok(Some((r, _))) if r.status == 408 && r.problems().is_none() => {}
                other => bad.push(format!("a stalled body was answered {other:?}")),
            },
        }
    }
    // Every slow connection was closed, so the descriptors go back to where they were.
    let mut fds_after = srv.open_fds();
    if let (Some(before), Some(_)) = (fds_before, fds_after) {
        let t0 = Instant::now();
        while fds_after.unwrap_or(0) > before + 8 && t0.elapsed() < Duration::from_secs(20) {
            tokio::time::sleep(Duration::from_millis(20)).await;
            fds_after = srv.open_fds();
        }
    }
    println!(
        "faults_serve: slow clients: {n} connections ({} trickling headers, {} stalled bodies), \
         {} closed as expected, {checks} health+infer checks meanwhile, {} failed checks; \
         server fds before {fds_before:?}, after {fds_after:?}",
        n.div_ceil(2),
        n / 2,
        n - bad.len(),
        failures.len()
    );
    assert!(
        bad.is_empty(),
        "{} slow clients: {:?}",
        bad.len(),
        &bad[..bad.len().min(5)]
    );
    assert!(failures.is_empty(), "{failures:?}");
    assert!(checks > 0);
    if let (Some(before), Some(after)) = (fds_before, fds_after) {
        assert!(after <= before + 8, "fds: {before} before, {after} after");
    }
    srv.assert_alive();
    assert_eq!(health(&mut c).await, 200);
    assert_eq!(srv.stop(), Some(0));
}

/// One connection more than `--max-connections` is answered 503 with a JSON error; once
/// the others close, new connections are served again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_cap_get_503_json() {
    let repo = repository();
    let mut srv = Server::start(
        repo.path(),
        &["--max-connections", "8", "--header-timeout-ms", "20000"],
    )
    .await;
    // The readiness probe's pooled connection may still hold a slot for a moment; hold the
    // rest with idle connections, then probe until the cap shows.
    let mut idle = Vec::new();
    for _ in 0..8 {
        idle.push(TcpStream::connect(srv.addr).await.unwrap());
    }
    let req = b"GET /v2/health/live HTTP/1.1\r\nHost: kiln\r\nConnection: close\r\n\r\n";
    // A probe answered 200 means a slot was free after all (the readiness probe's connection
    // closed after the idle ones were accepted): hold it with one more idle connection.
    let mut e = exchange(srv.addr, req, Duration::from_secs(10)).await;
    for _ in 0..4 {
        if e.responses.first().is_none_or(|r| r.status != 200) {
            break;
        }
        idle.push(TcpStream::connect(srv.addr).await.unwrap());
        tokio::time::sleep(Duration::from_millis(50)).await;
        e = exchange(srv.addr, req, Duration::from_secs(10)).await;
    }
    assert!(e.malformed.is_none() && !e.hung, "{e:?}");
    assert_eq!(e.responses.len(), 1, "{e:?}");
    let r = &e.responses[0];
    assert_eq!(r.status, 503, "{r:?}");
    assert!(r.problems().is_none(), "{:?}", r.problems());
    let msg = serde_json::from_slice::<Value>(&r.body).unwrap()["error"].to_string();
    assert!(msg.contains("--max-connections"), "{msg}");
    drop(idle);
    let t0 = Instant::now();
    loop {
        let e = exchange(srv.addr, req, Duration::from_secs(10)).await;
        if e.responses.first().map(|r| r.status) == Some(200) {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "{e:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    srv.assert_alive();
    assert_eq!(srv.stop(), Some(0));
}

// ---------------------------------------------------------------------------------------------
// Malformed requests.
// ---------------------------------------------------------------------------------------------

/// A committed corpus case: the request and the status it must get (`None`: any well-formed
/// answer, or a close without one).
struct Case {
    name: &'static str,
    request: Vec<u8>,
    expect: Option<u16>,
}

fn case(name: &'static str, request: impl Into<Vec<u8>>, expect: Option<u16>) -> Case {
    Case {
        name,
        request: request.into(),
        expect,
    }
}

fn post(path: &str, extra_headers: &str, body: &[u8]) -> Vec<u8> {
    let mut r = format!(
        "POST {path} HTTP/1.1\r\nHost: kiln\r\nConnection: close\r\nContent-Type: \
         application/json\r\nContent-Length: {}\r\n{extra_headers}\r\n",
        body.len()
    )
    .into_bytes();
    r.extend_from_slice(body);
    r
}

/// The corpus: what the fault campaign sent by hand, one case per way a request can be
/// broken, with the status each must get.
fn corpus() -> Vec<Case> {
    let ok_body = serde_json::to_vec(&infer_body(&rows(1, 2))).unwrap();
    let mut many_headers = String::from("GET /v2 HTTP/1.1\r\nHost: kiln\r\n");
    for i in 0..2000 {
        many_headers.push_str(&format!("X-H{i}: v\r\n"));
    }
    many_headers.push_str("\r\n");
    let long_url = format!(
        "GET /v2/models/{} HTTP/1.1\r\nHost: kiln\r\n\r\n",
        "a".repeat(70 * 1024)
    );
    let huge_header = format!(
        "GET /v2 HTTP/1.1\r\nHost: kiln\r\nX-Big: {}\r\n\r\n",
        "b".repeat(500 * 1024)
    );
    let close = "Host: kiln\r\nConnection: close\r\n";
    vec![
        case("bad request line", "GARBAGE\r\n\r\n", Some(400)),
        case("no version", "GET /v2\r\n\r\n", Some(400)),
        case(
            "unknown version",
            format!("GET /v2 HTTP/9.9\r\n{close}\r\n"),
            Some(400),
        ),
        case(
            "space in the target",
            format!("GET /v2 /x HTTP/1.1\r\n{close}\r\n"),
            Some(400),
        ),
        case(
            "raw non-ASCII byte in the target",
            [
                &b"GET /v2/models/\xff HTTP/1.1\r\n"[..],
                close.as_bytes(),
                b"\r\n",
            ]
            .concat(),
            Some(400),
        ),
        case(
            "duplicate Content-Length",
            format!(
                "POST /v2/models/tiny/infer HTTP/1.1\r\n{close}Content-Length: 2\r\nContent-Length: 3\r\n\r\n{{}}"
            ),
            Some(400),
        ),
        case(
            "Content-Length not a number",
            format!(
                "POST /v2/models/tiny/infer HTTP/1.1\r\n{close}Content-Length: abc\r\n\r\n{{}}"
            ),
            Some(400),
        ),
        case(
            "negative Content-Length",
            format!("POST /v2/models/tiny/infer HTTP/1.1\r\n{close}Content-Length: -1\r\n\r\n"),
            Some(400),
        ),
        case(
            "Content-Length overflowing 64 bits",
            format!(
                "POST /v2/models/tiny/infer HTTP/1.1\r\n{close}Content-Length: 99999999999999999999999\r\n\r\n"
            ),
            Some(400),
        ),
        case(
            "Transfer-Encoding that is not chunked",
            format!(
                "POST /v2/models/tiny/infer HTTP/1.1\r\n{close}Transfer-Encoding: gzip\r\n\r\n"
            ),
            Some(400),
        ),
        case(
            "bad chunk size",
            format!(
                "POST /v2/models/tiny/infer HTTP/1.1\r\n{close}Transfer-Encoding: chunked\r\n\r\nzz\r\n{{}}\r\n0\r\n\r\n"
            ),
            Some(400),
        ),
        case(
            "space before a header colon",
            "GET /v2 HTTP/1.1\r\nHost : kiln\r\n\r\n",
            Some(400),
        ),
        case(
            "invalid header name",
            format!("GET /v2 HTTP/1.1\r\n{close}Ho(st: kiln\r\n\r\n"),
            Some(400),
        ),
        case(
            "NUL in a header value",
            [
                &b"GET /v2 HTTP/1.1\r\nX-A: a\0b\r\n"[..],
                close.as_bytes(),
                b"\r\n",
            ]
            .concat(),
            Some(400),
        ),
        case(
            "folded header line",
            format!("GET /v2 HTTP/1.1\r\n{close}X-A: a\r\n b\r\n\r\n"),
            Some(400),
        ),
        case("70 KB URL", long_url, Some(414)),
        case("2,000 headers", many_headers, Some(431)),
        case("500 KB header", huge_header, Some(431)),
        case(
            "model name that is not UTF-8",
            format!("GET /v2/models/%ff%fe HTTP/1.1\r\n{close}\r\n"),
            Some(400),
        ),
        case(
            "infer on a model name that is not UTF-8",
            post("/v2/models/%ff%fe/infer", "", &ok_body),
            Some(400),
        ),
        case(
            "version that is not UTF-8",
            format!("GET /v2/models/tiny/versions/%c3%28 HTTP/1.1\r\n{close}\r\n"),
            Some(400),
        ),
        case(
            "body that is not JSON",
            post("/v2/models/tiny/infer", "", b"{nope"),
            Some(400),
        ),
        case(
            "empty body",
            post("/v2/models/tiny/infer", "", b""),
            Some(400),
        ),
        case(
            "body over --max-body-bytes",
            format!(
                "POST /v2/models/tiny/infer HTTP/1.1\r\n{close}Content-Length: 100000000\r\n\r\n"
            ),
            Some(413),
        ),
        case(
            "body shorter than Content-Length",
            format!(
                "POST /v2/models/tiny/infer HTTP/1.1\r\n{close}Content-Length: 100\r\n\r\n{{}}"
            ),
            Some(408),
        ),
        case(
            "unsupported Content-Encoding",
            post(
                "/v2/models/tiny/infer",
                "Content-Encoding: gzip\r\n",
                &ok_body,
            ),
            Some(400),
        ),
        case(
            "binary header length past the body",
            post(
                "/v2/models/tiny/infer",
                "Inference-Header-Content-Length: 99999\r\n",
                &ok_body,
            ),
            Some(400),
        ),
        case(
            "unknown route",
            format!("GET /nope HTTP/1.1\r\n{close}\r\n"),
            Some(404),
        ),
        case(
            "wrong method",
            format!("DELETE /v2 HTTP/1.1\r\n{close}\r\n"),
            Some(405),
        ),
        case(
            "lower-case method",
            format!("get /v2 HTTP/1.1\r\n{close}\r\n"),
            Some(405),
        ),
        case(
            "asterisk target",
            format!("OPTIONS * HTTP/1.1\r\n{close}\r\n"),
            None,
        ),
        case(
            "absolute-form target",
            format!("GET http://kiln/v2 HTTP/1.1\r\n{close}\r\n"),
            Some(200),
        ),
        case(
            "bare LF line ends",
            "GET /v2 HTTP/1.1\nHost: kiln\nConnection: close\n\n",
            None,
        ),
        case(
            "HTTP/1.0 without Host",
            "GET /v2 HTTP/1.0\r\n\r\n",
            Some(200),
        ),
        case("HTTP/2 preface", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", None),
        case(
            "valid request (control)",
            post("/v2/models/tiny/infer", "", &ok_body),
            Some(200),
        ),
        case(
            "Expect: 100-continue",
            post(
                "/v2/models/tiny/infer",
                "Expect: 100-continue\r\n",
                &ok_body,
            ),
            Some(200),
        ),
        case(
            "pipelined valid then garbage",
            [
                b"GET /v2 HTTP/1.1\r\nHost: kiln\r\n\r\n".to_vec(),
                b"GARBAGE\r\n\r\n".to_vec(),
            ]
            .concat(),
            None,
        ),
    ]
}

/// SplitMix64, for the mutation generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Valid requests the generator starts from.
fn seeds() -> Vec<Vec<u8>> {
    let body = serde_json::to_vec(&infer_body(&rows(2, 3))).unwrap();
    vec![
        b"GET /v2/health/ready HTTP/1.1\r\nHost: kiln\r\nConnection: close\r\n\r\n".to_vec(),
        b"GET /v2/models/tiny HTTP/1.1\r\nHost: kiln\r\nConnection: close\r\n\r\n".to_vec(),
        b"GET /v2/models/tiny/versions/1/config HTTP/1.1\r\nHost: kiln\r\n\r\n".to_vec(),
        post("/v2/models/tiny/infer", "", &body),
        post("/v2/models/tiny/versions/1/infer", "Accept: */*\r\n", &body),
        [
            &b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: kiln\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n"[..],
            format!("{:x}\r\n", body.len()).as_bytes(),
            &body,
            b"\r\n0\r\n\r\n",
        ]
        .concat(),
    ]
}

/// One to three random mutations of a valid request.
fn mutate(rng: &mut Rng, base: &[u8]) -> Vec<u8> {
    const TOKENS: &[&[u8]] = &[
        b"\r\n",
        b"\n",
        b"\r",
        b" ",
        b":",
        b"\0",
        b"\xff\xfe",
        b"%ff",
        b"Content-Length: 5\r\n",
        b"Content-Length: 18446744073709551616\r\n",
        b"Transfer-Encoding: chunked\r\n",
        b"Transfer-Encoding: chunked, gzip\r\n",
        b"Expect: 100-continue\r\n",
        b"HTTP/1.0",
        b"HTTP/2.0",
        b"\t",
        b"{",
        b"\"",
        b"../",
    ];
    let mut r = base.to_vec();
    for _ in 0..1 + rng.below(3) {
        let len = r.len().max(1);
        match rng.below(9) {
            0 => {
                // Flip a byte.
                let i = rng.below(len).min(r.len().saturating_sub(1));
                if !r.is_empty() {
                    r[i] ^= 1 << rng.below(8);
                }
            }
            1 => {
                let i = rng.below(len + 1).min(r.len());
                let t = TOKENS[rng.below(TOKENS.len())];
                r.splice(i..i, t.iter().copied());
            }
            2 => {
                // Delete a range.
                let i = rng.below(len).min(r.len());
                let j = (i + 1 + rng.below(16)).min(r.len());
                r.drain(i..j);
            }
            3 => {
                // Truncate.
                let i = rng.below(len);
                r.truncate(i);
            }
            4 => {
                // Duplicate a header line.
                let text = String::from_utf8_lossy(&r).into_owned();
                let lines: Vec<&str> = text.split("\r\n").collect();
                if lines.len() > 2 {
                    let k = 1 + rng.below(lines.len() - 2);
                    let dup = format!("{}\r\n", lines[k]);
                    if let Some(at) = find(&r, b"\r\n") {
                        r.splice(at + 2..at + 2, dup.bytes());
                    }
                }
            }
            5 => {
                // A random Content-Length value.
                if let Some(at) = find(&r, b"Content-Length: ") {
                    let end = at + 16 + find(&r[at + 16..], b"\r\n").unwrap_or(0);
                    let v = match rng.below(4) {
                        0 => (rng.next() % 100_000).to_string(),
                        1 => format!("{}", rng.next()),
                        2 => " 3 , 3".into(),
                        _ => "0x10".into(),
                    };
                    r.splice(at + 16..end, v.bytes());
                }
            }
            6 => {
                // A long run of one byte (URL, header or body).
                let i = rng.below(len + 1).min(r.len());
                let n = [100, 5_000, 70_000][rng.below(3)];
                let b = [b'a', b'%', b'/', 0xff][rng.below(4)];
                r.splice(i..i, std::iter::repeat_n(b, n));
            }
            7 => {
                // Many headers.
                if let Some(at) = find(&r, b"\r\n") {
                    let n = [50, 150, 3000][rng.below(3)];
                    let h: String = (0..n).map(|k| format!("X-{k}: v\r\n")).collect();
                    r.splice(at + 2..at + 2, h.bytes());
                }
            }
            _ => {
                // Random bytes.
                let i = rng.below(len + 1).min(r.len());
                let n = 1 + rng.below(8);
                let bytes: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
                r.splice(i..i, bytes);
            }
        }
    }
    r
}

/// Every corpus case gets its status with a JSON error body, every mutated request gets
/// well-formed HTTP answers (4xx with `{"error": ...}`) or a clean close, the server never
/// crashes or hangs a connection, and it is healthy afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn malformed_requests_get_well_formed_json_answers() {
    let repo = repository();
    let mut srv = Server::start(
        repo.path(),
        &[
            "--header-timeout-ms",
            "1000",
            "--body-timeout-ms",
            "1000",
            "--max-body-bytes",
            "1048576",
        ],
    )
    .await;
    let addr = srv.addr;
    let limit = Duration::from_secs(20);
    let mut failures = Vec::new();

    // The corpus.
    let corpus = corpus();
    let n_corpus = corpus.len();
    let mut set = tokio::task::JoinSet::new();
    for c in corpus {
        set.spawn(async move {
            let e = exchange(addr, &c.request, limit).await;
            (c.name, c.expect, e)
        });
    }
    while let Some(r) = set.join_next().await {
        let (name, expect, e) = r.unwrap();
        let mut why = Vec::new();
        if let Some(m) = &e.malformed {
            why.push(m.clone());
        }
        if e.hung {
            why.push("the connection was still open at the deadline".into());
        }
        for r in &e.responses {
            if let Some(p) = r.problems() {
                why.push(p);
            }
        }
        if let Some(want) = expect {
            let got: Vec<u16> = e.responses.iter().map(|r| r.status).collect();
            if got.first() != Some(&want) {
                why.push(format!("statuses {got:?}; expected {want}"));
            }
        }
        if !why.is_empty() {
            failures.push(format!("corpus `{name}`: {}", why.join("; ")));
        }
    }

    // The generator.
    let n_mutated = count(300, 20_000);
    let seeds = seeds();
    let mut rng = Rng(seed());
    let mut closed_without_answer = 0usize;
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    let sem = Arc::new(tokio::sync::Semaphore::new(32));
    let mut set = tokio::task::JoinSet::new();
    for i in 0..n_mutated {
        let base = &seeds[rng.below(seeds.len())];
        let req = mutate(&mut rng, base);
        let permit = sem.clone().acquire_owned().await.unwrap();
        set.spawn(async move {
            let e = exchange(addr, &req, limit).await;
            drop(permit);
            (i, req, e)
        });
        while let Some(r) = set.try_join_next() {
            let (i, req, e) = r.unwrap();
            tally(
                i,
                &req,
                e,
                &mut failures,
                &mut statuses,
                &mut closed_without_answer,
            );
        }
    }
    while let Some(r) = set.join_next().await {
        let (i, req, e) = r.unwrap();
        tally(
            i,
            &req,
            e,
            &mut failures,
            &mut statuses,
            &mut closed_without_answer,
        );
    }

    srv.assert_alive();
    let mut c = srv.client();
    assert_eq!(health(&mut c).await, 200, "not healthy after the campaign");
    let r = c
        .post_json("/v2/models/tiny/infer", &infer_body(&rows(1, 5)))
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    println!(
        "faults_serve: malformed requests: {n_corpus} corpus cases + {n_mutated} mutated (seed \
         {}), {} failures; statuses {statuses:?}, {closed_without_answer} closed without an \
         answer",
        seed(),
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "{} failures, first: {:#?}",
        failures.len(),
        &failures[..failures.len().min(8)]
    );
    assert_eq!(srv.stop(), Some(0));
}

fn tally(
    i: usize,
    req: &[u8],
    e: Exchange,
    failures: &mut Vec<String>,
    statuses: &mut std::collections::BTreeMap<u16, usize>,
    closed: &mut usize,
) {
    let mut why = Vec::new();
    if let Some(m) = &e.malformed {
        why.push(m.clone());
    }
    if e.hung {
        why.push("the connection was still open at the deadline".into());
    }
    for r in &e.responses {
        *statuses.entry(r.status).or_default() += 1;
        if let Some(p) = r.problems() {
            why.push(p);
        }
    }
    if e.responses.is_empty() {
        *closed += 1;
    }
    if !why.is_empty() {
        failures.push(format!(
            "mutated request {i} ({:?}): {}",
            String::from_utf8_lossy(&req[..req.len().min(120)]),
            why.join("; ")
        ));
    }
}

// ---------------------------------------------------------------------------------------------
// Overload.
// ---------------------------------------------------------------------------------------------

/// Far more concurrent requests than the queue holds: every request is answered, 200 or a
/// 503 JSON error, none is lost, and health stays up throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn overload_answers_200_or_503_and_loses_nothing() {
    let (clients, per_client) = (count(48, 256), count(15, 200));
    let repo = repository();
    let mut srv = Server::start(
        repo.path(),
        &[
            // Triton's fixed-delay policy holds every batch 3 ms, so a queue of 4 overflows
            // under 48 clients; the idle policy runs lone requests at once on this tiny model
            // and would rarely queue at all.
            "--batching",
            "delay",
            "--max-batch-size",
            "8",
            "--max-queue-size",
            "4",
            "--max-queue-delay-us",
            "3000",
            "--request-timeout-ms",
            "5000",
        ],
    )
    .await;
    let addr = srv.addr;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let health_task = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut c = HttpClient::new(addr).with_timeout(Duration::from_secs(10));
            let (mut n, mut bad) = (0usize, 0usize);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                n += 1;
                if health(&mut c).await != 200 {
                    bad += 1;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            (n, bad)
        })
    };
    let mut set = tokio::task::JoinSet::new();
    for k in 0..clients {
        set.spawn(async move {
            let mut c = HttpClient::new(addr).with_timeout(Duration::from_secs(30));
            let body = infer_body(&rows(1, k as u32));
            let mut tally = std::collections::BTreeMap::<String, usize>::new();
            let mut problems = Vec::new();
            for _ in 0..per_client {
                match c.post_json("/v2/models/tiny/infer", &body).await {
                    Ok(r) => {
                        *tally.entry(r.status.to_string()).or_default() += 1;
                        let ok_json = r.status == 200
                            || serde_json::from_slice::<Value>(&r.body)
                                .is_ok_and(|v| v["error"].is_string());
                        if !(r.status == 200 || r.status == 503) || !ok_json {
                            problems.push(format!("{} {}", r.status, r.text()));
                        }
                    }
                    Err(e) => {
                        *tally.entry("io".into()).or_default() += 1;
                        problems.push(format!("io: {e}"));
                    }
                }
            }
            (tally, problems)
        });
    }
    let mut tally = std::collections::BTreeMap::<String, usize>::new();
    let mut problems = Vec::new();
    while let Some(r) = set.join_next().await {
        let (t, p) = r.unwrap();
        for (k, v) in t {
            *tally.entry(k).or_default() += v;
        }
        problems.extend(p);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (checks, bad_checks) = health_task.await.unwrap();
    let sent = clients * per_client;
    let answered: usize = tally
        .iter()
        .filter(|(k, _)| *k == "200" || *k == "503")
        .map(|(_, v)| v)
        .sum();
    println!(
        "faults_serve: overload: {sent} requests from {clients} concurrent clients into a queue \
         of 4: {tally:?}, {} failures; {checks} health checks, {bad_checks} not 200",
        problems.len()
    );
    assert!(
        problems.is_empty(),
        "{} problems: {:?}",
        problems.len(),
        &problems[..problems.len().min(5)]
    );
    assert_eq!(answered, sent, "{tally:?}");
    assert!(
        tally.get("503").copied().unwrap_or(0) > 0,
        "never overloaded: {tally:?}"
    );
    assert!(tally.get("200").copied().unwrap_or(0) > 0, "{tally:?}");
    assert_eq!(bad_checks, 0);
    srv.assert_alive();
    assert_eq!(srv.stop(), Some(0));
}

// ---------------------------------------------------------------------------------------------
// Reload storm.
// ---------------------------------------------------------------------------------------------

/// How broken version `v` is made (`None`: a good version; 1 is the trained model, later
/// good ones have their biases shifted by v/100).
fn breakage(v: u64) -> Option<&'static str> {
    const KINDS: [&str; 6] = [
        "flipped weight byte",
        "truncated weights",
        "no manifest",
        "manifest that does not parse",
        "wrong architecture",
        "empty directory",
    ];
    (v >= 2 && v % 2 == 1).then(|| KINDS[(v as usize / 2) % KINDS.len()])
}

/// Write version `v` into `tiny/` atomically (built beside, then renamed in).
fn write_version(tiny: &Path, v: u64) {
    let tmp = tiny.parent().unwrap().join(format!(".tmp-{v}"));
    match breakage(v) {
        None => export_variant(&tmp, v as f32 / 100.0),
        Some(kind) => {
            copy_dir(trained(), &tmp);
            let w = tmp.join(WEIGHTS_FILE);
            let m = tmp.join(MANIFEST_FILE);
            match kind {
                "flipped weight byte" => {
                    let mut b = std::fs::read(&w).unwrap();
                    let n = b.len();
                    b[n - 5] ^= 0x40;
                    std::fs::write(&w, b).unwrap();
                }
                "truncated weights" => {
                    let b = std::fs::read(&w).unwrap();
                    std::fs::write(&w, &b[..b.len() / 2]).unwrap();
                }
                "no manifest" => std::fs::remove_file(&m).unwrap(),
                "manifest that does not parse" => std::fs::write(&m, "{\"format\": ").unwrap(),
                "wrong architecture" => {
                    let mut j: Value =
                        serde_json::from_str(&std::fs::read_to_string(&m).unwrap()).unwrap();
                    j["architecture"]["hidden"] = json!([8]);
                    std::fs::write(&m, serde_json::to_vec_pretty(&j).unwrap()).unwrap();
                }
                _ => {
                    std::fs::remove_file(&m).unwrap();
                    std::fs::remove_file(&w).unwrap();
                }
            }
        }
    }
    std::fs::rename(&tmp, tiny.join(v.to_string())).unwrap();
}

/// Good and broken versions are written into the repository while requests flow: no
/// request fails, every answer comes from a good version (checked against that version's
/// own predictions), versions never go backwards for a client, and the last good version is
/// the one served at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reload_storm_serves_only_good_versions() {
    let versions = count(13, 31) as u64;
    let repo = repository();
    let tiny = repo.path().join("tiny");
    let mut srv = Server::start(repo.path(), &["--poll-interval-ms", "25"]).await;
    let addr = srv.addr;
    let x = rows(2, 9);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut clients = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let stop = stop.clone();
        let body = infer_body(&x);
        clients.spawn(async move {
            let mut c = HttpClient::new(addr).with_timeout(Duration::from_secs(20));
            let mut seen: Vec<(u64, Vec<f32>)> = Vec::new();
            let mut problems = Vec::new();
            let mut last = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match c.post_json("/v2/models/tiny/infer", &body).await {
                    Ok(r) if r.status == 200 => {
                        let v = r.json();
                        let version: u64 = v["model_version"].as_str().unwrap().parse().unwrap();
                        if version < last {
                            problems.push(format!("version went back from {last} to {version}"));
                        }
                        last = version;
                        seen.push((version, mean_of(&v)));
                    }
                    Ok(r) => problems.push(format!("{} {}", r.status, r.text())),
                    Err(e) => problems.push(format!("io: {e}")),
                }
            }
            (seen, problems)
        });
    }
    let mut last_good = 1;
    for v in 2..=versions {
        write_version(&tiny, v);
        if breakage(v).is_none() {
            last_good = v;
        }
        // Let a poll or two pass between writes, sometimes fewer.
        tokio::time::sleep(Duration::from_millis(if v % 3 == 0 { 5 } else { 60 })).await;
    }
    // The last version written is broken: the last good one must end up served.
    assert!(breakage(versions).is_some());
    let mut c = srv.client();
    let t0 = Instant::now();
    loop {
        let r = c.get("/v2/models/tiny").await.unwrap();
        if r.json()["versions"] == json!([last_good.to_string()]) {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "still serving {} instead of {last_good}",
            r.json()["versions"]
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A few more requests on the settled version, then stop the clients.
    tokio::time::sleep(Duration::from_millis(100)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut problems = Vec::new();
    let mut by_version = std::collections::BTreeMap::<u64, Vec<f32>>::new();
    let mut requests = 0usize;
    while let Some(r) = clients.join_next().await {
        let (seen, p) = r.unwrap();
        problems.extend(p);
        requests += seen.len();
        for (v, mean) in seen {
            if breakage(v).is_some() {
                problems.push(format!("answered by broken version {v}"));
            }
            let prev = by_version.entry(v).or_insert_with(|| mean.clone());
            if *prev != mean {
                problems.push(format!("version {v} gave two different answers"));
            }
        }
    }
    // Each good version's answers equal its own predictions.
    for (v, mean) in &by_version {
        if breakage(*v).is_some() {
            continue;
        }
        let want = predictor(&tiny.join(v.to_string())).predict(&x, 2).unwrap();
        if *mean != want.mean {
            problems.push(format!(
                "version {v} answered {mean:?}, its predictor {:?}",
                want.mean
            ));
        }
    }
    let r = c
        .post_json("/v2/models/tiny/infer", &infer_body(&x))
        .await
        .unwrap();
    assert_eq!(r.json()["model_version"], last_good.to_string());
    println!(
        "faults_serve: reload storm: {} versions written ({} good, {} broken), {requests} \
         requests during the storm, versions served {:?}, {} failures",
        versions - 1,
        (2..=versions).filter(|v| breakage(*v).is_none()).count(),
        (2..=versions).filter(|v| breakage(*v).is_some()).count(),
        by_version.keys().collect::<Vec<_>>(),
        problems.len()
    );
    assert!(
        problems.is_empty(),
        "{} problems: {:?}",
        problems.len(),
        &problems[..problems.len().min(5)]
    );
    assert!(requests > 0);
    srv.assert_alive();
    assert_eq!(srv.stop(), Some(0));
}
