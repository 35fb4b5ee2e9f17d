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

    fn get(&self, key: &str) -> Option<&'a Value> {
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
