//! The checked-in JSON Schema matches the spec types.

#[test]
fn checked_in_schema_is_current() {
    let current = trainrun::spec::schema_json();
    let checked_in = std::fs::read_to_string("schemas/trainrun.schema.json").unwrap_or_default();
    assert!(
        checked_in == current,
        "schemas/trainrun.schema.json is stale; regenerate it with \
         `cargo run --release -- schema > schemas/trainrun.schema.json`"
    );
}
