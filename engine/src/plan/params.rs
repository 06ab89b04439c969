//! `${NAME}` parameter substitution in plan string values.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::error::{Error, Result};

/// Replaces every `${NAME}` in string values of `value` with `params[NAME]`. A name that is
/// not given is an error naming the JSON path where it is used.
pub fn substitute(value: Value, params: &BTreeMap<String, String>) -> Result<Value> {
    walk(value, params, "")
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
}
