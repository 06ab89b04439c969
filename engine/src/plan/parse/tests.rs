use super::*;
use crate::error::ErrorKind;
use serde_json::json;

fn field(v: Value) -> String {
    let e = plan(&v).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Plan, "{e}");
    e.context.field.clone().unwrap_or_default()
}

#[test]
fn unknown_function_names_its_path() {
    let v = json!({"ops": [{"id": "y", "op": "elementwise", "inputs": ["x"],
        "expr": {"op": "add", "args": [{"op": "ad", "args": []}, {"const": 1}]}}]});
    assert_eq!(field(v), "ops[0].expr.args[0].op");
}

#[test]
fn unknown_op_names_its_path() {
    let v = json!({"ops": [{"id": "y", "op": "reshape", "input": "x"}]});
    assert_eq!(field(v), "ops[0].op");
}

#[test]
fn parses_the_era5_sum_shape() {
    let v = json!({"arrays": [{"id": "x", "zarr": "/d"}], "ops": [
        {"id": "y", "op": "elementwise", "inputs": ["x"], "expr": {"op": "multiply", "args": [
            {"op": "add", "args": [{"input": 0}, {"const": 1}]}, {"const": 2}]}},
        {"id": "s", "op": "reduce", "input": "y", "func": "sum", "axes": [0]},
        {"id": "o", "op": "write", "input": "s", "target": "/t"}]});
    let p = plan(&v).unwrap();
    assert_eq!(p.ops.len(), 3);
    assert!(matches!(
        p.ops[1].op,
        Op::Reduce {
            func: ReduceFunc::Sum,
            ..
        }
    ));
}

/// A valid plan touching every object kind, to misspell fields in.
fn full() -> Value {
    json!({"version": 1, "arrays": [{"id": "x", "zarr": "/d", "shape": [4], "dtype": "float32"}],
        "groups": [{"target": "/g"}],
        "ops": [
            {"id": "y", "op": "elementwise", "inputs": ["x"], "expr": {"op": "add", "args": [
                {"input": 0}, {"op": "negative", "args": [{"const": 1, "dtype": "int8"}]}]}},
            {"id": "o", "op": "write", "input": "y", "target": "/g/o",
             "codec": {"name": "blosc", "cname": "zstd"}}]})
}

#[test]
fn the_full_plan_parses() {
    let p = plan(&full()).unwrap();
    assert_eq!(p.groups.len(), 1);
}

#[test]
fn a_misspelt_field_anywhere_names_its_path() {
    let cases: [(&str, &str); 7] = [
        ("/verison", "verison"),
        ("/arrays/0/dtpye", "arrays[0].dtpye"),
        ("/groups/0/overwite", "groups[0].overwite"),
        ("/ops/0/inptus", "ops[0].inptus"),
        (
            "/ops/0/expr/args/1/args/0/dtyp",
            "ops[0].expr.args[1].args[0].dtyp",
        ),
        ("/ops/1/codec/clvl", "ops[1].codec.clvl"),
        ("/ops/1/regoin", "ops[1].regoin"),
    ];
    for (pointer, path) in cases {
        let mut v = full();
        let (parent, key) = pointer.rsplit_once('/').unwrap();
        v.pointer_mut(parent)
            .and_then(Value::as_object_mut)
            .unwrap()
            .insert(key.to_string(), json!(1));
        let e = plan(&v).unwrap_err();
        assert_eq!(e.context.field.as_deref(), Some(path), "{e}");
        assert!(e.message.contains(key), "{e}");
    }
}

#[test]
fn a_wrong_type_names_its_path() {
    let mut v = full();
    v["ops"][0]["expr"]["args"][0]["input"] = json!("zero");
    assert_eq!(field(v), "ops[0].expr.args[0].input");
    let mut v = full();
    v["arrays"][0]["shape"][0] = json!(-4);
    assert_eq!(field(v), "arrays[0].shape[0]");
}

#[test]
fn version_other_than_one_is_refused() {
    let mut v = full();
    v["version"] = json!(2);
    let e = plan(&v).unwrap_err();
    assert_eq!(e.context.field.as_deref(), Some("version"));
    assert!(e.message.contains("version 1"), "{e}");
    let mut v = full();
    v.as_object_mut().unwrap().remove("version");
    assert!(plan(&v).is_ok());
}

#[test]
fn array_chunks_are_not_part_of_the_format() {
    let mut v = full();
    v["arrays"][0]["chunks"] = json!([2]);
    assert_eq!(field(v), "arrays[0].chunks");
}

#[test]
fn a_missing_tag_names_its_object() {
    let mut v = full();
    v["ops"][1]["codec"] = json!({"level": 3});
    let e = plan(&v).unwrap_err();
    assert_eq!(e.context.field.as_deref(), Some("ops[1].codec"), "{e}");
    assert!(e.message.contains("name"), "{e}");
}
