//! docs/plan-ir.schema.json is the JSON Schema generated from the plan's wire types.
//! Regenerate it with `CHUNKFUSE_WRITE_SCHEMA=1 cargo test --release --test plan_schema`.

use std::path::PathBuf;

fn committed() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/plan-ir.schema.json")
}

#[test]
fn committed_schema_is_the_generated_one() {
    let generated = chunkfuse_engine::plan::wire::schema();
    let text = serde_json::to_string_pretty(&generated).unwrap() + "\n";
    let path = committed();
    if std::env::var_os("CHUNKFUSE_WRITE_SCHEMA").is_some() {
        std::fs::write(&path, &text).unwrap();
    }
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        on_disk == text,
        "{} differs from the schema generated from engine/src/plan/wire; regenerate it with \
         CHUNKFUSE_WRITE_SCHEMA=1 cargo test --release --test plan_schema",
        path.display()
    );
}
