//! The intake router's refusals, in process (no broker needed: nothing here reaches the queue).
//! The accepted path, over real HTTP with a real broker, is in crates/kiln/tests/intake_e2e.rs.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use kiln_intake::{http::router, Intake};
use kiln_queue::{NodeProducer, ProducerConfig};
use kiln_store::Store;
use tower::ServiceExt;

async fn app() -> (axum::Router, Store, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::connect(&format!("sqlite://{}", dir.path().join("k.db").display()))
        .await
        .expect("store");
    // Port 1: nothing listens; any attempt to produce would fail, and none is made.
    let producer = NodeProducer::new(ProducerConfig::new("127.0.0.1:1")).expect("producer");
    (
        router(Arc::new(Intake::new(store.clone(), producer))),
        store,
        dir,
    )
}

async fn call(
    app: &axum::Router,
    method: &str,
    uri: &str,
    ct: Option<&str>,
    body: &str,
) -> (StatusCode, serde_json::Value) {
    let mut req = Request::builder().method(method).uri(uri);
    if let Some(ct) = ct {
        req = req.header("content-type", ct);
    }
    let resp = app
        .clone()
        .oneshot(req.body(Body::from(body.to_string())).expect("request"))
        .await
        .expect("response");
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .expect("body");
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null),
    )
}

const HEADER: &str = "hostname,rack,bmc_address,gpu_model,gpu_count,firmware_bmc,firmware_bios,firmware_gpu_vbios,firmware_nic\n";

#[tokio::test]
async fn healthz_answers_when_the_store_does() {
    let (app, _store, _dir) = app().await;
    let (status, body) = call(&app, "GET", "/healthz", None, "").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["status"], "ok");
}

#[tokio::test]
async fn refusals_carry_a_status_and_a_reason_and_record_nothing() {
    let (app, store, _dir) = app().await;
    let good_row = "n-01,a,10.0.0.1,H100,8,1,2,3,4\n";

    let (status, body) = call(
        &app,
        "POST",
        "/v1/racks/a/manifest",
        Some("text/plain"),
        good_row,
    )
    .await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert!(
        body["error"].as_str().unwrap_or("").contains("text/csv"),
        "{body}"
    );

    let (status, body) = call(
        &app,
        "POST",
        "/v1/racks/a%20b/manifest",
        Some("text/csv"),
        good_row,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        body["error"].as_str().unwrap_or("").contains("bad rack"),
        "{body}"
    );

    let manifest =
        format!("{HEADER}{good_row}n-02,a,10.0.0.2,,8,1,2,3,4\nn-01,b,10.0.0.3,H100,8,1,2,3,4\n");
    let (status, body) = call(
        &app,
        "POST",
        "/v1/racks/a/manifest",
        Some("text/csv; charset=utf-8"),
        &manifest,
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let errors = body["errors"].as_array().expect("errors");
    let got: Vec<(u64, &str)> = errors
        .iter()
        .map(|e| {
            (
                e["line"].as_u64().unwrap_or(0),
                e["field"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        got,
        [(3, "gpu_model"), (4, "rack"), (4, "hostname")],
        "{body}"
    );

    let (status, body) = call(
        &app,
        "POST",
        "/v1/racks/a/manifest",
        Some("application/json"),
        "{\"nodes\": 3}",
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["errors"][0]["field"], "manifest");

    assert!(store
        .node_states(&["n-01", "n-02"])
        .await
        .expect("states")
        .is_empty());
}
