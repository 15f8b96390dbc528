//! The OpenAPI document the API serves is the one checked in at `docs/api/openapi.json`, so a
//! change to a route or a body shows up in review. After changing the API, regenerate it with
//!
//! ```sh
//! STRIA_UPDATE_OPENAPI=1 cargo test -p stria-mgmt --test openapi_document_is_checked_in
//! ```

use std::path::PathBuf;

fn checked_in_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/api/openapi.json")
}

#[test]
fn the_openapi_document_matches_the_checked_in_one() {
    let served = stria_mgmt::api::openapi().to_pretty_json().expect("the document encodes");
    let path = checked_in_path();
    if std::env::var_os("STRIA_UPDATE_OPENAPI").is_some() {
        std::fs::write(&path, format!("{served}\n")).expect("write docs/api/openapi.json");
        return;
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        checked_in.trim_end() == served.trim_end(),
        "docs/api/openapi.json differs from the API's document: regenerate it with \
         STRIA_UPDATE_OPENAPI=1 cargo test -p stria-mgmt --test openapi_document_is_checked_in \
         and review the diff"
    );
}

#[test]
fn the_document_is_openapi_3_1_with_bearer_auth_on_data_routes() {
    let doc: serde_json::Value =
        serde_json::from_str(&stria_mgmt::api::openapi().to_pretty_json().expect("encodes"))
            .expect("JSON");
    assert!(doc["openapi"].as_str().expect("version").starts_with("3.1"));
    assert_eq!(doc["components"]["securitySchemes"]["bearer"]["scheme"], "bearer");
    assert_eq!(doc["security"][0]["bearer"], serde_json::json!([]));
    let paths = doc["paths"].as_object().expect("paths");
    for path in paths.keys() {
        assert!(path.starts_with("/api/v1/") || path == "/metrics", "{path} outside /api/v1");
    }
    for open in ["/api/v1/health", "/api/v1/openapi.json"] {
        assert_eq!(paths[open]["get"]["security"], serde_json::json!([{}]), "{open} is open");
    }
    for route in [
        "/api/v1/cluster",
        "/api/v1/drives/{id}/fail",
        "/api/v1/targets/{id}/rebuild-rate",
        "/api/v1/targets/{id}/scrub",
        "/api/v1/volumes/{name}/resize",
        "/api/v1/exports/{name}/initiators",
        "/api/v1/events",
        "/api/v1/performance",
        "/metrics",
    ] {
        assert!(paths.contains_key(route), "{route} is documented");
    }
}
