//! `${NAME}` parameter substitution in plan string values.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::error::{Error, Result};

/// Replaces every `${NAME}` in string values of `value` with `params[NAME]`. A name that is
/// not given is an error naming the JSON path where it is used.
pub fn substitute(value: Value, params: &BTreeMap<String, String>) -> Result<Value> {
    walk(value, params, "")
}

/// Checks that every name in `params` is a parameter of the plan `value`: used as `${NAME}`
/// in a string value, or declared in its `params` block. The error names the unknown
/// parameter and the plan's.
pub fn check_known(value: &Value, params: &BTreeMap<String, String>) -> Result<()> {
    let mut known = std::collections::BTreeSet::new();
    if let Some(declared) = value.get("params").and_then(Value::as_object) {
        known.extend(declared.keys().cloned());
    }
    used_names(value, true, &mut known);
    for name in params.keys() {
        if !known.contains(name) {
            let names: Vec<&str> = known.iter().map(String::as_str).collect();
            return Err(Error::plan(
                "--param",
                format!(
                    "unknown parameter \"{name}\": the plan's parameters are {}",
                    if names.is_empty() {
                        "none".to_string()
                    } else {
                        names.join(", ")
                    }
                ),
            ));
        }
    }
    Ok(())
}

/// Adds the `NAME` of every `${NAME}` in the string values of `value` (outside a top-level
/// `params` block) to `names`.
fn used_names(value: &Value, top: bool, names: &mut std::collections::BTreeSet<String>) {
    match value {
        Value::String(s) => {
            let mut rest = s.as_str();
            while let Some(start) = rest.find("${") {
                let after = &rest[start + 2..];
                let Some(end) = after.find('}') else { break };
                names.insert(after[..end].to_string());
                rest = &after[end + 1..];
            }
        }
        Value::Array(items) => items.iter().for_each(|v| used_names(v, false, names)),
        Value::Object(map) => map
            .iter()
            .filter(|(k, _)| !(top && k.as_str() == "params"))
            .for_each(|(_, v)| used_names(v, false, names)),
        _ => {}
    }
}

fn walk(value: Value, params: &BTreeMap<String, String>, path: &str) -> Result<Value> {
    Ok(match value {
        Value::String(s) => Value::String(replace(&s, params, path)?),
        Value::Array(items) => Value::Array(
            items
                .into_iter()
                .enumerate()
                .map(|(i, v)| walk(v, params, &format!("{path}[{i}]")))
                .collect::<Result<_>>()?,
        ),
        Value::Object(map) => {
            let mut out = serde_json::Map::new();
            for (k, v) in map {
                // The `params` block documents parameters; it is not substituted.
                let child = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                let v = if path.is_empty() && k == "params" {
                    v
                } else {
                    walk(v, params, &child)?
                };
                out.insert(k, v);
            }
            Value::Object(out)
        }
        other => other,
    })
}

fn replace(s: &str, params: &BTreeMap<String, String>, path: &str) -> Result<String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            return Err(Error::plan(
                path,
                format!("unterminated \"${{\" in \"{s}\""),
            ));
        };
        let name = &after[..end];
        let Some(v) = params.get(name) else {
            return Err(Error::plan(
                path,
                format!("missing parameter \"{name}\": pass --param {name}=VALUE"),
            ));
        };
        out.push_str(v);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn substitutes_and_names_missing_parameters() {
        let mut p = BTreeMap::new();
        p.insert("source".to_string(), "/data/x.zarr".to_string());
        let v = substitute(json!({"arrays": [{"zarr": "${source}"}]}), &p).unwrap();
        assert_eq!(v, json!({"arrays": [{"zarr": "/data/x.zarr"}]}));
        let e = substitute(json!({"ops": [{"target": "${target}"}]}), &p).unwrap_err();
        assert_eq!(e.context.field.as_deref(), Some("ops[0].target"));
        assert!(e.message.contains("missing parameter \"target\""));
    }

    #[test]
    fn unknown_parameters_are_named_with_the_plans() {
        let plan = json!({"params": {"level": "declared, unused"},
            "arrays": [{"zarr": "${source}"}], "ops": [{"target": "${dir}/${name}.zarr"}]});
        let mut p = BTreeMap::new();
        for name in ["source", "dir", "name", "level"] {
            p.insert(name.to_string(), "x".to_string());
        }
        check_known(&plan, &p).unwrap();
        p.insert("taget".to_string(), "x".to_string());
        let e = check_known(&plan, &p).unwrap_err();
        assert_eq!(e.context.field.as_deref(), Some("--param"));
        assert_eq!(
            e.message,
            "unknown parameter \"taget\": the plan's parameters are dir, level, name, source"
        );
        let e = check_known(&json!({"ops": []}), &p).unwrap_err();
        assert!(
            e.message.ends_with("the plan's parameters are none"),
            "{}",
            e.message
        );
    }
}
