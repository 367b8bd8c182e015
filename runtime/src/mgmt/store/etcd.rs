//! [`EtcdStore`]: the cluster store in etcd, shared by the daemons of
//! several nodes (`xlfs daemon --store etcd://HOST:PORT[,HOST:PORT...]`).
//!
//! It speaks etcd's v3 API through the JSON gateway every etcd serves on
//! its client URL (`POST /v3/kv/range`, `/v3/kv/txn`, `/v3/watch`; keys and
//! values base64), with HTTP/1.0 requests on plain TCP: one small client,
//! no gRPC stack to build. Endpoints are tried in order until one answers.
//!
//! Keys, under the prefix (`xlfs/` unless the URL gives another,
//! `etcd://h:p/PREFIX`):
//! - `volumes/NAME`: the spec as TOML; its `mod_revision` is the
//!   [`Versioned::revision`], and a put or delete is one transaction that
//!   compares it (or `create_revision == 0` for [`Expect::Absent`]), so two
//!   daemons changing one volume at once cannot both win;
//! - `bricks/NAME/HOST:DIR`: a [`BrickState`] as JSON, written by the
//!   daemon that serves the brick, removed with the volume;
//! - `peers/NODE`: a [`Peer`] as JSON.
//!
//! [`EtcdStore::changes`] is fed by a watch on the whole prefix, kept by
//! a thread that reconnects (and re-reads from the last revision it saw)
//! when etcd goes away and comes back.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde_json::{Value, json};
use tokio::sync::watch;

use super::{BrickState, Expect, Peer, Store, StoreError, Versioned};
use crate::mgmt::spec::{BrickSpec, VolumeSpec};

/// How long connecting to an endpoint may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long one request may take once connected.
const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest answer read (a list of every volume).
const MAX_ANSWER: u64 = 64 << 20;

/// The cluster store in etcd (see the module documentation).
pub struct EtcdStore {
    endpoints: Vec<String>,
    prefix: String,
    changes: watch::Receiver<u64>,
    /// The id under `cluster-id`, made by the first daemon to open it.
    cluster: String,
}

impl EtcdStore {
    /// Connects to the etcd cluster named by `url` (`etcd://HOST:PORT
    /// [,HOST:PORT...][/PREFIX]`): checks that it answers and starts the
    /// watch.
    pub fn open(url: &str) -> Result<EtcdStore, StoreError> {
        let bad = |why: &str| StoreError::Url { url: url.to_string(), why: why.to_string() };
        let rest =
            url.strip_prefix("etcd://").ok_or_else(|| bad("expected etcd://HOST:PORT[,HOST:PORT...][/PREFIX]"))?;
        let (hosts, prefix) = rest.split_once('/').unwrap_or((rest, "xlfs"));
        let prefix = prefix.trim_matches('/');
        if prefix.is_empty() || prefix.contains(char::is_whitespace) {
            return Err(bad("the key prefix after the address must be a non-empty word"));
        }
        let endpoints: Vec<String> = hosts.split(',').map(str::to_string).collect();
        for e in &endpoints {
            let ok = e.rsplit_once(':').is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok());
            if !ok {
                return Err(bad(&format!("endpoint {e:?} is not HOST:PORT")));
            }
        }
        let (tx, rx) = watch::channel(0);
        let mut s = EtcdStore { endpoints, prefix: format!("{prefix}/"), changes: rx, cluster: String::new() };
        s.cluster = s.cluster_id()?;
        let now = s.current_revision()?;
        tx.send_replace(now);
        let watcher = Watcher { endpoints: s.endpoints.clone(), prefix: s.prefix.clone(), tx };
        std::thread::Builder::new()
            .name("etcd-watch".into())
            .spawn(move || watcher.run(now))
            .map_err(|e| StoreError::Unavailable { endpoint: url.to_string(), why: e.to_string() })?;
        s.changes.mark_unchanged();
        Ok(s)
    }

    fn key(&self, rest: &str) -> String {
        format!("{}{rest}", self.prefix)
    }

    /// POSTs `body` to `path` on the first endpoint that answers. The
    /// call blocks (up to its timeouts); on a multi-threaded runtime the
    /// worker hands its other tasks on first.
    fn post(&self, path: &str, body: &Value) -> Result<Value, StoreError> {
        let call = || post_any(&self.endpoints, path, body);
        match tokio::runtime::Handle::try_current() {
            Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(call)
            }
            _ => call(),
        }
    }

    /// The cluster id, made now if this is the first daemon.
    fn cluster_id(&self) -> Result<String, StoreError> {
        let key = self.key("cluster-id");
        let fresh = xlfs_sdk::Gfid::random().to_string();
        let r = self.post(
            "/v3/kv/txn",
            &json!({
                "compare": [{ "key": b64(&key), "result": "EQUAL", "target": "CREATE", "create_revision": "0" }],
                "success": [{ "request_put": { "key": b64(&key), "value": b64(&fresh) } }],
                "failure": [{ "request_range": { "key": b64(&key) } }],
            }),
        )?;
        if r["succeeded"].as_bool() == Some(true) {
            return Ok(fresh);
        }
        let kv = &r["responses"][0]["response_range"]["kvs"][0]["value"];
        unb64(kv)
            .map(|v| String::from_utf8_lossy(&v).into_owned())
            .ok_or_else(|| StoreError::CorruptKey { key, why: "no value".into() })
    }

    fn current_revision(&self) -> Result<u64, StoreError> {
        let r = self.post("/v3/kv/range", &json!({ "key": b64(&self.key("")), "count_only": true }))?;
        Ok(num(&r["header"]["revision"]))
    }

    /// Every key-value under `dir` (a prefix ending in `/`), as (key, value,
    /// mod_revision).
    fn range(&self, dir: &str) -> Result<Vec<(String, Vec<u8>, u64)>, StoreError> {
        let start = self.key(dir);
        let r = self.post("/v3/kv/range", &json!({ "key": b64(&start), "range_end": b64(&prefix_end(&start)) }))?;
        let mut out = Vec::new();
        for kv in r["kvs"].as_array().into_iter().flatten() {
            let key = unb64(&kv["key"]).map(|k| String::from_utf8_lossy(&k).into_owned()).unwrap_or_default();
            let value = unb64(&kv["value"]).unwrap_or_default();
            out.push((key, value, num(&kv["mod_revision"])));
        }
        Ok(out)
    }

    fn get_one(&self, key: &str) -> Result<Option<(Vec<u8>, u64)>, StoreError> {
        let r = self.post("/v3/kv/range", &json!({ "key": b64(key) }))?;
        Ok(r["kvs"]
            .as_array()
            .and_then(|a| a.first())
            .map(|kv| (unb64(&kv["value"]).unwrap_or_default(), num(&kv["mod_revision"]))))
    }

    fn put_raw(&self, key: &str, value: &[u8]) -> Result<u64, StoreError> {
        let r = self.post("/v3/kv/put", &json!({ "key": b64(key), "value": B64.encode(value) }))?;
        Ok(num(&r["header"]["revision"]))
    }

    fn delete_raw(&self, key: &str, range_end: Option<&str>) -> Result<(), StoreError> {
        let mut body = json!({ "key": b64(key) });
        if let Some(end) = range_end {
            body["range_end"] = json!(b64(end));
        }
        self.post("/v3/kv/deleterange", &body).map(|_| ())
    }

    fn decode_spec(&self, key: &str, value: &[u8]) -> Result<VolumeSpec, StoreError> {
        let text = String::from_utf8_lossy(value);
        toml::from_str(&text).map_err(|e| StoreError::CorruptKey { key: key.to_string(), why: e.to_string() })
    }
}

impl Store for EtcdStore {
    fn get(&self, name: &str) -> Result<Option<Versioned>, StoreError> {
        let key = self.key(&format!("volumes/{name}"));
        match self.get_one(&key)? {
            Some((value, revision)) => Ok(Some(Versioned { spec: self.decode_spec(&key, &value)?, revision })),
            None => Ok(None),
        }
    }

    fn put(&self, spec: &VolumeSpec, expect: Expect) -> Result<u64, StoreError> {
        let key = self.key(&format!("volumes/{}", spec.name));
        let text =
            toml::to_string(spec).map_err(|e| StoreError::Encode { name: spec.name.clone(), why: e.to_string() })?;
        let compare = match expect {
            Expect::Absent => {
                json!({ "key": b64(&key), "result": "EQUAL", "target": "CREATE", "create_revision": "0" })
            }
            Expect::Revision(r) => {
                json!({ "key": b64(&key), "result": "EQUAL", "target": "MOD", "mod_revision": r.to_string() })
            }
        };
        let put = json!({ "request_put": { "key": b64(&key), "value": B64.encode(text.as_bytes()) } });
        let r = self.post("/v3/kv/txn", &json!({ "compare": [compare], "success": [put], "failure": [] }))?;
        if r["succeeded"].as_bool() != Some(true) {
            return Err(StoreError::Conflict(spec.name.clone()));
        }
        Ok(num(&r["header"]["revision"]))
    }

    fn delete(&self, name: &str, expect: u64) -> Result<(), StoreError> {
        let key = self.key(&format!("volumes/{name}"));
        let bricks = self.key(&format!("bricks/{name}/"));
        let compare =
            json!({ "key": b64(&key), "result": "EQUAL", "target": "MOD", "mod_revision": expect.to_string() });
        let success = json!([
            { "request_delete_range": { "key": b64(&key) } },
            { "request_delete_range": { "key": b64(&bricks), "range_end": b64(&prefix_end(&bricks)) } },
        ]);
        let r = self.post("/v3/kv/txn", &json!({ "compare": [compare], "success": success, "failure": [] }))?;
        if r["succeeded"].as_bool() != Some(true) {
            return Err(StoreError::Conflict(name.to_string()));
        }
        Ok(())
    }

    fn list(&self) -> Result<Vec<Versioned>, StoreError> {
        let mut out = Vec::new();
        for (key, value, revision) in self.range("volumes/")? {
            out.push(Versioned { spec: self.decode_spec(&key, &value)?, revision });
        }
        out.sort_by(|a, b| a.spec.name.cmp(&b.spec.name));
        Ok(out)
    }

    fn brick_states(&self, volume: &str) -> Result<BTreeMap<BrickSpec, BrickState>, StoreError> {
        let dir = format!("bricks/{volume}/");
        let mut out = BTreeMap::new();
        for (key, value, _) in self.range(&dir)? {
            let brick = key.strip_prefix(&self.key(&dir)).and_then(|b| BrickSpec::parse(b).ok());
            let state = serde_json::from_slice::<BrickState>(&value);
            match (brick, state) {
                (Some(b), Ok(s)) => {
                    out.insert(b, s);
                }
                (_, e) => tracing::warn!(key, "ignoring a brick state that does not parse: {:?}", e.err()),
            }
        }
        Ok(out)
    }

    fn publish(&self, volume: &str, brick: &BrickSpec, state: Option<&BrickState>) -> Result<(), StoreError> {
        let key = self.key(&format!("bricks/{volume}/{brick}"));
        match state {
            Some(s) => {
                let value = serde_json::to_vec(s)
                    .map_err(|e| StoreError::Encode { name: volume.to_string(), why: e.to_string() })?;
                self.put_raw(&key, &value).map(|_| ())
            }
            None => self.delete_raw(&key, None),
        }
    }

    fn peers(&self) -> Result<Vec<Peer>, StoreError> {
        let mut out = Vec::new();
        for (key, value, _) in self.range("peers/")? {
            let p = serde_json::from_slice::<Peer>(&value)
                .map_err(|e| StoreError::CorruptKey { key: key.clone(), why: e.to_string() })?;
            out.push(p);
        }
        Ok(out)
    }

    fn put_peer(&self, peer: &Peer) -> Result<(), StoreError> {
        let value =
            serde_json::to_vec(peer).map_err(|e| StoreError::Encode { name: peer.node.clone(), why: e.to_string() })?;
        self.put_raw(&self.key(&format!("peers/{}", peer.node)), &value).map(|_| ())
    }

    fn remove_peer(&self, node: &str) -> Result<(), StoreError> {
        self.delete_raw(&self.key(&format!("peers/{node}")), None)
    }

    fn changes(&self) -> Option<watch::Receiver<u64>> {
        Some(self.changes.clone())
    }

    fn describe(&self) -> String {
        format!("etcd://{}/{}", self.endpoints.join(","), self.prefix.trim_end_matches('/'))
    }

    fn cluster(&self) -> String {
        format!("etcd:{}", self.cluster)
    }
}

/// Keeps a watch on the prefix and sends each new revision.
struct Watcher {
    endpoints: Vec<String>,
    prefix: String,
    tx: watch::Sender<u64>,
}

impl Watcher {
    fn run(self, mut seen: u64) {
        let mut logged = false;
        while !self.tx.is_closed() {
            match self.watch_once(&mut seen) {
                Ok(()) => logged = false,
                Err(e) if !logged => {
                    tracing::warn!("etcd watch: {e}; retrying every second");
                    logged = true;
                }
                Err(_) => {}
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    }

    /// One watch stream, until it breaks; `seen` follows the revisions.
    fn watch_once(&self, seen: &mut u64) -> Result<(), StoreError> {
        let create = json!({ "create_request": {
            "key": b64(&self.prefix),
            "range_end": b64(&prefix_end(&self.prefix)),
            "start_revision": (*seen + 1).to_string(),
        }});
        let (endpoint, stream) = connect_any(&self.endpoints)?;
        let unavailable = |why: String| StoreError::Unavailable { endpoint: endpoint.clone(), why };
        let stream = send(stream, "/v3/watch", &create).map_err(|e| unavailable(e.to_string()))?;
        // Silence is normal on a watch: only a broken stream ends it
        // (etcd sends progress notifications on request only).
        stream.set_read_timeout(None).map_err(|e| unavailable(e.to_string()))?;
        let mut lines = BufReader::new(stream);
        let mut header = String::new();
        loop {
            header.clear();
            if lines.read_line(&mut header).map_err(|e| unavailable(e.to_string()))? == 0 {
                return Err(unavailable("closed".into()));
            }
            if header.trim().is_empty() {
                break;
            }
        }
        let mut line = String::new();
        loop {
            line.clear();
            if lines.read_line(&mut line).map_err(|e| unavailable(e.to_string()))? == 0 {
                return Err(unavailable("the watch stream ended".into()));
            }
            let Ok(v) = serde_json::from_str::<Value>(line.trim()) else { continue };
            let res = &v["result"];
            if num(&res["compact_revision"]) > 0 {
                // The revisions after `seen` are gone: start from now, and
                // tell the daemon to look at everything again.
                *seen = num(&res["header"]["revision"]);
                self.tx.send_replace(*seen);
                return Ok(());
            }
            let rev = res["events"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|e| num(&e["kv"]["mod_revision"]))
                .max()
                .unwrap_or(0)
                .max(num(&res["header"]["revision"]));
            if rev > *seen {
                *seen = rev;
                self.tx.send_replace(rev);
            }
            if self.tx.is_closed() {
                return Ok(());
            }
        }
    }
}

fn b64(s: &str) -> String {
    B64.encode(s.as_bytes())
}

fn unb64(v: &Value) -> Option<Vec<u8>> {
    B64.decode(v.as_str()?).ok()
}

/// etcd's int64s come as JSON strings; absent means 0.
fn num(v: &Value) -> u64 {
    match v {
        Value::String(s) => s.parse().unwrap_or(0),
        Value::Number(n) => n.as_u64().unwrap_or(0),
        _ => 0,
    }
}

/// The end of the range of keys starting with `prefix` (its last byte
/// plus one, as etcd's `WithPrefix`).
fn prefix_end(prefix: &str) -> String {
    let mut b = prefix.as_bytes().to_vec();
    while let Some(last) = b.pop() {
        if last < 0xff {
            b.push(last + 1);
            return String::from_utf8_lossy(&b).into_owned();
        }
    }
    "\0".into()
}

fn connect_any(endpoints: &[String]) -> Result<(String, TcpStream), StoreError> {
    let mut last = None;
    for e in endpoints {
        let addrs = match e.to_socket_addrs() {
            Ok(a) => a,
            Err(err) => {
                last = Some(StoreError::Unavailable { endpoint: e.clone(), why: err.to_string() });
                continue;
            }
        };
        for a in addrs {
            match TcpStream::connect_timeout(&a, CONNECT_TIMEOUT) {
                Ok(s) => return Ok((e.clone(), s)),
                Err(err) => last = Some(StoreError::Unavailable { endpoint: e.clone(), why: err.to_string() }),
            }
        }
    }
    Err(last.unwrap_or_else(|| StoreError::Unavailable { endpoint: String::new(), why: "no endpoint".into() }))
}

/// Writes one HTTP/1.0 POST (so the answer is never chunked: it ends
/// where the connection closes).
fn send(mut s: TcpStream, path: &str, body: &Value) -> std::io::Result<TcpStream> {
    s.set_read_timeout(Some(IO_TIMEOUT))?;
    s.set_write_timeout(Some(IO_TIMEOUT))?;
    let body = body.to_string();
    let head =
        format!("POST {path} HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n", body.len());
    s.write_all(head.as_bytes())?;
    s.write_all(body.as_bytes())?;
    s.flush()?;
    Ok(s)
}

fn post_any(endpoints: &[String], path: &str, body: &Value) -> Result<Value, StoreError> {
    let (endpoint, s) = connect_any(endpoints)?;
    let fail = |why: String| StoreError::Unavailable { endpoint: endpoint.clone(), why };
    let s = send(s, path, body).map_err(|e| fail(e.to_string()))?;
    let mut raw = Vec::new();
    s.take(MAX_ANSWER).read_to_end(&mut raw).map_err(|e| fail(e.to_string()))?;
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").ok_or_else(|| fail("no HTTP answer".into()))?;
    let head = String::from_utf8_lossy(&raw[..split]);
    let status = head.split_whitespace().nth(1).and_then(|c| c.parse::<u16>().ok()).unwrap_or(0);
    let body: Value = serde_json::from_slice(&raw[split + 4..]).map_err(|e| fail(format!("{path}: {e}")))?;
    if status != 200 {
        let why = body["error"].as_str().or(body["message"].as_str()).unwrap_or("no message");
        return Err(fail(format!("{path}: HTTP {status}: {why}")));
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked_and_prefixes_end_right() {
        for bad in ["http://h:1", "etcd://h", "etcd://h:x", "etcd://h:1,:2", "etcd://h:1/"] {
            let e = EtcdStore::open(bad).err().expect(bad);
            assert!(matches!(e, StoreError::Url { .. }), "{bad}: {e}");
            assert!(e.to_string().contains(bad), "{e}");
        }
        assert_eq!(prefix_end("xlfs/"), "xlfs0");
        assert_eq!(prefix_end("a"), "b");
        assert_eq!(num(&json!("42")), 42);
        assert_eq!(num(&Value::Null), 0);
    }

    #[test]
    fn an_etcd_that_does_not_answer_is_named() {
        // A port nobody listens on (bound, then closed).
        let port = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
        let e = EtcdStore::open(&format!("etcd://127.0.0.1:{port}")).err().expect("nothing there");
        assert!(matches!(e, StoreError::Unavailable { .. }) && e.to_string().contains(&port.to_string()), "{e}");
    }
}
