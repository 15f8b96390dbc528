//! REST request bodies, through the decoder the API's JSON extractor uses (`decode_json`):
//! it must accept exactly what plain serde_json accepts, refuse everything else with a 400 of
//! a documented code and a message, and an accepted body must decode the same after a trip
//! through a generic JSON value (so no field depends on how the client spelled it).

use serde::de::DeserializeOwned;
use stria_mgmt::api_error::decode_json;
use stria_mgmt::api_types::{
    CreateExport, CreateVolume, InitiatorRule, NewDrive, RebuildRate, ResizeVolume, StartScrub,
};

use crate::mode_and_rest;

/// Every JSON body type of the API, as `(name, check)`.
pub const BODIES: &[(&str, crate::Target)] = &[
    ("CreateVolume", check::<CreateVolume>),
    ("ResizeVolume", check::<ResizeVolume>),
    ("CreateExport", check::<CreateExport>),
    ("InitiatorRule", check::<InitiatorRule>),
    ("RebuildRate", check::<RebuildRate>),
    ("NewDrive", check::<NewDrive>),
    ("StartScrub", check::<StartScrub>),
];

/// Input: one byte picking the body type (modulo the table), then the body.
pub fn rest_body(data: &[u8]) {
    let (which, body) = mode_and_rest(data);
    let (_, check) = BODIES[which as usize % BODIES.len()];
    check(body);
}

fn check<T: DeserializeOwned + std::fmt::Debug>(body: &[u8]) {
    let ours = decode_json::<T>(body);
    let plain = serde_json::from_slice::<T>(body);
    match (&ours, &plain) {
        (Ok(a), Ok(b)) => assert_eq!(format!("{a:?}"), format!("{b:?}"), "decoders disagree"),
        (Err(e), Err(_)) => {
            assert_eq!(e.status.as_u16(), 400, "refused with {}", e.status);
            assert!(matches!(e.code, "invalid" | "invalid_json"), "undocumented code {}", e.code);
            assert!(!e.message.is_empty(), "refusal without a message");
        }
        (a, b) => panic!("decode_json says {a:?}, serde_json says {b:?}"),
    }
    let Ok(value) = ours else { return };
    let generic: serde_json::Value =
        serde_json::from_slice(body).expect("an accepted body is JSON");
    let respelled = serde_json::to_vec(&generic).expect("a JSON value serialises");
    let again = decode_json::<T>(&respelled).expect("a respelled accepted body is accepted");
    assert_eq!(format!("{again:?}"), format!("{value:?}"), "body changes when respelled");
}
