//! A simulated node's BMC: the Redfish mockup served over HTTPS, rewritten for the node
//! (serial numbers, UUID, host name, firmware versions from its manifest row, a healthy
//! rollup, a clean system log) and for its faults (a drifted BIOS, a Critical SEL entry).
//!
//! Authentication as a BMC does it: the service root is open; everything else needs HTTP
//! basic or a session token (`POST /redfish/v1/SessionService/Sessions`, deleted with
//! `DELETE` on its `Location`). Open sessions are counted, so tests can see that agents log
//! out.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use serde_json::{json, Value};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use crate::node::SimNode;
use crate::spec::Fault;
use crate::stats::SimStats;

const SESSIONS: &str = "/redfish/v1/SessionService/Sessions";

pub struct Bmc {
    node: Arc<SimNode>,
    user: String,
    password: String,
    /// token -> session id.
    sessions: Mutex<HashMap<String, String>>,
    next_session: AtomicU64,
    stats: Arc<SimStats>,
    /// When the simulated node powered on: its informational log entry's time.
    booted: OffsetDateTime,
}

impl Bmc {
    pub fn new(node: Arc<SimNode>, user: &str, password: &str, stats: Arc<SimStats>) -> Bmc {
        Bmc {
            node,
            user: user.into(),
            password: password.into(),
            sessions: Mutex::new(HashMap::new()),
            next_session: AtomicU64::new(1),
            stats,
            booted: OffsetDateTime::now_utc(),
        }
    }

    pub fn router(self: Arc<Bmc>) -> Router {
        Router::new().fallback(handle).with_state(self)
    }

    fn authorized(&self, headers: &HeaderMap) -> bool {
        if let Some(token) = headers.get("X-Auth-Token").and_then(|v| v.to_str().ok()) {
            return self.lock_sessions().contains_key(token);
        }
        let Some(basic) = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Basic "))
        else {
            return false;
        };
        let want = format!("{}:{}", self.user, self.password);
        base64_decode(basic.trim()).is_some_and(|got| got == want.as_bytes())
    }

    fn lock_sessions(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn login(&self, body: &[u8]) -> Response {
        let creds: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let user = creds.get("UserName").and_then(Value::as_str);
        let password = creds.get("Password").and_then(Value::as_str);
        if user != Some(self.user.as_str()) || password != Some(self.password.as_str()) {
            return error(StatusCode::UNAUTHORIZED, "invalid UserName or Password");
        }
        let id = self
            .next_session
            .fetch_add(1, Ordering::Relaxed)
            .to_string();
        let token = format!("{:032x}", rand::random::<u128>());
        self.lock_sessions().insert(token.clone(), id.clone());
        self.stats.redfish_session_opened();
        let location = format!("{SESSIONS}/{id}");
        let doc = json!({"@odata.id": location, "@odata.type": "#Session.v1_7_0.Session",
            "Id": id, "Name": "User Session", "UserName": self.user});
        (
            StatusCode::CREATED,
            [("X-Auth-Token", token), ("Location", location)],
            axum::Json(doc),
        )
            .into_response()
    }

    fn logout(&self, id: &str, headers: &HeaderMap) -> Response {
        if !self.authorized(headers) {
            return error(StatusCode::UNAUTHORIZED, "authentication required");
        }
        let mut sessions = self.lock_sessions();
        let before = sessions.len();
        sessions.retain(|_, sid| sid != id);
        if sessions.len() == before {
            return error(StatusCode::NOT_FOUND, "no such session");
        }
        drop(sessions);
        self.stats.redfish_session_closed();
        StatusCode::NO_CONTENT.into_response()
    }

    /// Open sessions (the agent should leave none behind).
    pub fn open_sessions(&self) -> usize {
        self.lock_sessions().len()
    }

    /// The document at `path` as this node serves it.
    fn document(&self, path: &str) -> Option<Value> {
        let fx = &self.node.fixtures;
        let node = &self.node;
        if fx.sel_entries_paths.iter().any(|p| p == path) {
            let entries = self.sel_entries(path);
            return Some(json!({
                "@odata.id": path, "@odata.type": "#LogEntryCollection.LogEntryCollection",
                "Name": "Log Service Collection", "Members@odata.count": entries.len(),
                "Members": entries,
            }));
        }
        if let Some((parent, id)) = path.rsplit_once('/') {
            if fx.sel_entries_paths.iter().any(|p| p == parent) {
                return self
                    .sel_entries(parent)
                    .into_iter()
                    .find(|e| e.get("Id").and_then(Value::as_str) == Some(id));
            }
        }
        let mut doc = fx.redfish.get(path)?.clone();
        let set = |doc: &mut Value, key: &str, v: Value| {
            if let Some(o) = doc.as_object_mut() {
                o.insert(key.into(), v);
            }
        };
        if path == fx.system_path {
            set(&mut doc, "SerialNumber", node.serial().into());
            set(&mut doc, "HostName", node.hostname().into());
            set(&mut doc, "BiosVersion", node.bios_reported().into());
            set(
                &mut doc,
                "UUID",
                format!("4b53494d-0000-4000-8000-{:012x}", node.index + 1).into(),
            );
        } else if path.starts_with("/redfish/v1/Chassis/")
            && path.matches('/').count() == 4
            && doc.get("SerialNumber").is_some()
        {
            set(&mut doc, "SerialNumber", node.serial().into());
        } else if path == "/redfish/v1/UpdateService/FirmwareInventory/BMC" {
            set(&mut doc, "Version", node.spec.firmware_bmc.clone().into());
        } else if path == "/redfish/v1/UpdateService/FirmwareInventory/BIOS" {
            set(&mut doc, "Version", node.bios_reported().into());
        } else if path == "/redfish/v1/Managers/BMC" {
            set(
                &mut doc,
                "FirmwareVersion",
                node.spec.firmware_bmc.clone().into(),
            );
        } else if path.ends_with("/PowerSubsystem") {
            // The mockup's second bay is empty, so its redundancy is lost: a simulated node has
            // both power supplies, and with `psu-fail` loses the first one.
            if let Some(groups) = doc
                .get_mut("PowerSupplyRedundancy")
                .and_then(Value::as_array_mut)
            {
                for g in groups {
                    g["Status"] = if node.has(&Fault::PsuFail) {
                        json!({"State": "Enabled", "Health": "Critical"})
                    } else {
                        json!({"State": "Enabled", "Health": "OK"})
                    };
                }
            }
        } else if path.contains("/PowerSubsystem/PowerSupplies/") {
            let bay1 = path.ends_with("/Bay1");
            if node.has(&Fault::PsuFail) && bay1 {
                set(
                    &mut doc,
                    "Status",
                    json!({"State": "Enabled", "Health": "Critical", "Conditions": [{
                        "MessageId": "Power.1.0.PowerSupplyFailure",
                        "Message": "Power supply 'PSU 1' has failed.",
                        "Severity": "Critical", "MessageArgs": ["PSU 1"],
                        "Timestamp": OffsetDateTime::now_utc().format(&Rfc3339).unwrap_or_default(),
                    }]}),
                );
            } else {
                set(
                    &mut doc,
                    "Status",
                    json!({"State": "Enabled", "Health": "OK"}),
                );
            }
            if !bay1 && doc.get("SerialNumber").is_none() {
                set(
                    &mut doc,
                    "SerialNumber",
                    format!("{}-PSU2", node.serial()).into(),
                );
            }
        }
        Some(doc)
    }

    /// A collection with its members' documents in place of their links, as a BMC answers
    /// `$expand=.($levels=1)` (the mockup's service root says it supports it).
    fn expanded(&self, mut doc: Value) -> Value {
        if let Some(members) = doc.get_mut("Members").and_then(Value::as_array_mut) {
            for m in members.iter_mut() {
                let link = m
                    .get("@odata.id")
                    .and_then(Value::as_str)
                    .map(|p| p.trim_end_matches('/').to_string());
                if let Some(full) = link.and_then(|p| self.document(&p)) {
                    *m = full;
                }
            }
        }
        doc
    }

    /// The system log: a power-on entry (OK), and with `sel-critical` a Critical power
    /// supply entry. The fault is a recurring one: the BMC logs it again all the time, so
    /// its `Created` is the moment of reading, always after the node was registered.
    fn sel_entries(&self, collection: &str) -> Vec<Value> {
        let at = |t: OffsetDateTime| t.format(&Rfc3339).unwrap_or_default();
        let mut out = vec![json!({
            "@odata.id": format!("{collection}/1"), "@odata.type": "#LogEntry.v1_21_0.LogEntry",
            "Id": "1", "Name": "Log Entry 1", "EntryType": "SEL", "Severity": "OK",
            "Created": at(self.booted), "EntryCode": "Assert", "SensorType": "System Event",
            "Message": "System AC power on",
        })];
        if self.node.has(&Fault::SelCritical) {
            out.push(json!({
                "@odata.id": format!("{collection}/2"), "@odata.type": "#LogEntry.v1_21_0.LogEntry",
                "Id": "2", "Name": "Log Entry 2", "EntryType": "SEL", "Severity": "Critical",
                "Created": at(OffsetDateTime::now_utc()), "EntryCode": "Assert",
                "SensorType": "Power Supply", "SensorNumber": 21,
                "Message": "Power supply PSU2 failure detected",
            }));
        }
        out
    }
}

async fn handle(
    State(bmc): State<Arc<Bmc>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    bmc.stats.redfish_request();
    let path = uri.path().trim_end_matches('/');
    let path = if path.is_empty() { "/" } else { path };
    if method == Method::POST && path == SESSIONS {
        return bmc.login(&body);
    }
    if method == Method::DELETE {
        if let Some(id) = path.strip_prefix(&format!("{SESSIONS}/")) {
            return bmc.logout(id, &headers);
        }
    }
    if method != Method::GET {
        return error(
            StatusCode::METHOD_NOT_ALLOWED,
            "the simulated BMC is read-only",
        );
    }
    if path == "/redfish" {
        return axum::Json(json!({"v1": "/redfish/v1/"})).into_response();
    }
    if path != "/redfish/v1" && !bmc.authorized(&headers) {
        return error(StatusCode::UNAUTHORIZED, "authentication required");
    }
    let expand = uri.query().is_some_and(|q| q.contains("$expand"));
    match bmc.document(path) {
        Some(doc) if expand => axum::Json(bmc.expanded(doc)).into_response(),
        Some(doc) => axum::Json(doc).into_response(),
        None => error(StatusCode::NOT_FOUND, &format!("no resource at {path}")),
    }
}

fn error(status: StatusCode, message: &str) -> Response {
    (
        status,
        axum::Json(json!({"error": {"code": "Base.1.5.0.GeneralError", "message": message}})),
    )
        .into_response()
}

/// Standard base64 (with padding optional); `None` on a bad character.
fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in s.bytes().filter(|c| *c != b'=') {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_decodes() {
        assert_eq!(
            base64_decode("a2lsbjpzZWNyZXQ="),
            Some(b"kiln:secret".to_vec())
        );
        assert_eq!(base64_decode("YQ"), Some(b"a".to_vec()));
        assert_eq!(base64_decode("a*b"), None);
    }
}
