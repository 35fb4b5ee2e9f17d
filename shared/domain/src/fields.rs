//! Field-by-field validation of JSON request bodies, so that every 400 names
//! the field that was wrong.

use serde_json::{Map, Value};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

impl FieldError {
    pub fn new(field: &str, message: &str) -> Self {
        FieldError {
            field: field.to_string(),
            message: message.to_string(),
        }
    }
}

/// A JSON object being validated; `prefix` names where it sits in the body.
#[derive(Debug)]
pub struct Fields<'a> {
    obj: &'a Map<String, Value>,
    prefix: String,
}

impl<'a> Fields<'a> {
    pub fn new(v: &'a Value) -> Result<Self, FieldError> {
        match v {
            Value::Object(obj) => Ok(Fields {
                obj,
                prefix: String::new(),
            }),
            _ => Err(FieldError::new("body", "must be a JSON object")),
        }
    }

    pub fn nested(obj: &'a Map<String, Value>, prefix: &str) -> Result<Self, FieldError> {
        Ok(Fields {
            obj,
            prefix: format!("{prefix}."),
        })
    }

    fn name(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    fn err(&self, key: &str, msg: &str) -> FieldError {
        FieldError::new(&self.name(key), msg)
    }

    pub fn get(&self, key: &str) -> Option<&'a Value> {
        match self.obj.get(key) {
            None | Some(Value::Null) => None,
            Some(v) => Some(v),
        }
    }

    pub fn req_str(&self, key: &str) -> Result<&'a str, FieldError> {
        self.opt_str(key)?
            .ok_or_else(|| self.err(key, "is required"))
    }

    pub fn opt_str(&self, key: &str) -> Result<Option<&'a str>, FieldError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(self.err(key, "must be a string")),
        }
    }

    pub fn req_u64(&self, key: &str) -> Result<u64, FieldError> {
        self.opt_u64(key)?
            .ok_or_else(|| self.err(key, "is required"))
    }

    pub fn opt_u64(&self, key: &str) -> Result<Option<u64>, FieldError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Number(n)) => n
                .as_u64()
                .map(Some)
                .ok_or_else(|| self.err(key, "must be a non-negative integer")),
            Some(_) => Err(self.err(key, "must be a non-negative integer")),
        }
    }

    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>, FieldError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(self.err(key, "must be true or false")),
        }
    }

    pub fn opt_array(&self, key: &str) -> Result<Option<&'a Vec<Value>>, FieldError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(a)) => Ok(Some(a)),
            Some(_) => Err(self.err(key, "must be an array")),
        }
    }

    pub fn req_obj(&self, key: &str) -> Result<&'a Map<String, Value>, FieldError> {
        self.opt_obj(key)?
            .ok_or_else(|| self.err(key, "is required"))
    }

    pub fn opt_obj(&self, key: &str) -> Result<Option<&'a Map<String, Value>>, FieldError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Object(o)) => Ok(Some(o)),
            Some(_) => Err(self.err(key, "must be an object")),
        }
    }

    pub fn opt_str_list(&self, key: &str) -> Result<Option<Vec<String>>, FieldError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, v)| match v {
                    Value::String(s) => Ok(s.clone()),
                    _ => Err(FieldError::new(
                        &format!("{}[{i}]", self.name(key)),
                        "must be a string",
                    )),
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(_) => Err(self.err(key, "must be an array of strings")),
        }
    }

    /// Refuses keys the request type does not define, so typos are loud.
    pub fn only(&self, allowed: &[&str]) -> Result<(), FieldError> {
        match self.obj.keys().find(|k| !allowed.contains(&k.as_str())) {
            Some(k) => Err(self.err(k, "is not a known field")),
            None => Ok(()),
        }
    }
}

/// How deeply JSON that enters a Run may nest (DynamoDB's own limit for
/// a document): arguments the model gives, results tools give back, API
/// bodies. A Run's record nests them a few levels deeper still, and must
/// stay readable by the parsers that read it again.
pub const MAX_JSON_DEPTH: usize = 32;

/// How many levels of arrays and objects `v` nests (a scalar is 0).
pub fn json_depth(v: &Value) -> usize {
    // Iterative: the value may be as deep as its parser allowed.
    let mut deepest = 0;
    let mut stack = vec![(v, 0usize)];
    while let Some((v, d)) = stack.pop() {
        match v {
            Value::Array(items) => {
                deepest = deepest.max(d + 1);
                stack.extend(items.iter().map(|x| (x, d + 1)));
            }
            Value::Object(m) => {
                deepest = deepest.max(d + 1);
                stack.extend(m.values().map(|x| (x, d + 1)));
            }
            Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) => {}
        }
    }
    deepest
}

/// Why `v` may not enter a Run, if it nests deeper than [`MAX_JSON_DEPTH`].
pub fn too_deep(v: &Value) -> Option<String> {
    let depth = json_depth(v);
    (depth > MAX_JSON_DEPTH)
        .then(|| format!("nested {depth} levels deep, over the limit of {MAX_JSON_DEPTH}"))
}

/// The largest input schema a tool may have.
pub const MAX_SCHEMA_BYTES: usize = 64 * 1024;

/// Whether `schema` can be a tool's input schema: a JSON object, not
/// nested too deeply, of at most [`MAX_SCHEMA_BYTES`].
pub fn schema_ok(schema: &Value) -> bool {
    schema.is_object()
        && too_deep(schema).is_none()
        && serde_json::to_vec(schema).map_or(0, |b| b.len()) <= MAX_SCHEMA_BYTES
}

#[cfg(test)]
mod depth_tests {
    use super::*;
    use serde_json::json;

    fn nested(levels: usize) -> Value {
        (0..levels).fold(json!(1), |v, _| json!([v]))
    }

    #[test]
    fn depth_counts_arrays_and_objects() {
        assert_eq!(json_depth(&json!(1)), 0);
        assert_eq!(json_depth(&json!({"a": [1, {"b": 2}]})), 3);
        assert_eq!(json_depth(&nested(MAX_JSON_DEPTH)), MAX_JSON_DEPTH);
        assert_eq!(too_deep(&nested(MAX_JSON_DEPTH)), None);
        assert!(too_deep(&nested(MAX_JSON_DEPTH + 1))
            .unwrap()
            .contains("33 levels"));
    }
}
