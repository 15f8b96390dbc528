//! A chunk map opened against an array it was not created on is refused with a clear error,
//! and `create` never overwrites an existing chunk map.

mod common;

use common::*;
use stria_engine::{Engine, EngineError};
use stria_proto::fs::TargetId;

#[test]
fn opening_with_the_wrong_array_is_refused() {
    let (_a, array_a) = raid5(4);
    let (_b, array_b) = raid5(4);
    let (_c, blank) = raid5(4);
    let dir_a = temp_dir("wrong-a");
    let dir_b = temp_dir("wrong-b");
    drop(Engine::create(array_a.clone(), &dir_a, TargetId(1)).expect("create a"));
    drop(Engine::create(array_b.clone(), &dir_b, TargetId(2)).expect("create b"));

    let err = Engine::open(array_b.clone(), &dir_a).expect_err("map a on array b");
    assert!(matches!(err, EngineError::WrongArray(_)), "{err}");
    assert!(
        err.to_string().contains("target t2") && err.to_string().contains("target t1"),
        "{err}"
    );
    let err = Engine::open(blank, &dir_a).expect_err("map a on a blank array");
    assert!(matches!(err, EngineError::Superblock(_)), "{err}");
    let err = Engine::create(array_a.clone(), &dir_a, TargetId(1)).expect_err("create twice");
    assert!(matches!(err, EngineError::Exists(_)), "{err}");
    let err = Engine::open(array_a.clone(), &temp_dir("nothing")).expect_err("no map");
    assert!(matches!(err, EngineError::MissingMap(_)), "{err}");

    let engine = Engine::open(array_a, &dir_a).expect("the right pair opens");
    assert_eq!(engine.target(), TargetId(1));
    drop(engine);
}
