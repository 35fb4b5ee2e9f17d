//! Reading and writing DynamoDB attribute maps.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;

use crate::error::StoreError;

pub type Item = HashMap<String, AttributeValue>;

pub fn s(v: impl Into<String>) -> AttributeValue {
    AttributeValue::S(v.into())
}

pub fn n(v: impl ToString) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

pub fn get_s(item: &Item, key: &str) -> Result<String, StoreError> {
    match item.get(key) {
        Some(AttributeValue::S(v)) => Ok(v.clone()),
        _ => Err(StoreError::Corrupt(format!(
            "attribute {key} missing or not a string"
        ))),
    }
}

pub fn opt_s(item: &Item, key: &str) -> Option<String> {
    match item.get(key) {
        Some(AttributeValue::S(v)) => Some(v.clone()),
        _ => None,
    }
}

pub fn get_n<T: std::str::FromStr>(item: &Item, key: &str) -> Result<T, StoreError> {
    match item.get(key) {
        Some(AttributeValue::N(v)) => v
            .parse()
            .map_err(|_| StoreError::Corrupt(format!("attribute {key} is not a number"))),
        _ => Err(StoreError::Corrupt(format!(
            "attribute {key} missing or not a number"
        ))),
    }
}

pub fn get_json<T: serde::de::DeserializeOwned>(item: &Item, key: &str) -> Result<T, StoreError> {
    let raw = get_s(item, key)?;
    serde_json::from_str(&raw).map_err(|e| StoreError::Corrupt(format!("attribute {key}: {e}")))
}

pub fn json<T: serde::Serialize>(v: &T) -> AttributeValue {
    // Serialising our own types cannot fail (no non-string map keys).
    AttributeValue::S(serde_json::to_string(v).unwrap_or_else(|_| "null".into()))
}

/// Seconds since the epoch, for TTL attributes.
pub fn ttl_after(now_ms: i64, days: i64) -> AttributeValue {
    n(now_ms / 1000 + days * 86_400)
}

/// Writes `item` only if no item with its key exists (`key_attr` absent);
/// an existing one is a `Conflict`.
pub async fn put_new(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    item: Item,
    key_attr: &str,
) -> Result<(), StoreError> {
    dynamo
        .put_item()
        .table_name(table)
        .set_item(Some(item))
        .condition_expression(format!("attribute_not_exists({key_attr})"))
        .send()
        .await
        .map_err(crate::error::classify)?;
    Ok(())
}

/// Whether a conditional write was made: `false` when its condition did
/// not hold (someone else's port, a full quota), any other error as it is.
pub fn written<T>(r: Result<T, StoreError>) -> Result<bool, StoreError> {
    match r {
        Ok(_) => Ok(true),
        Err(StoreError::Conflict { .. }) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Writes `items` in one transaction. When an item's condition fails,
/// the `Conflict` names `owners[i]` of the first such item `i` (the
/// caller's numbering of what it wrote).
pub async fn transact(
    dynamo: &aws_sdk_dynamodb::Client,
    items: Vec<aws_sdk_dynamodb::types::TransactWriteItem>,
    owners: &[Option<usize>],
) -> Result<(), StoreError> {
    use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
    match dynamo
        .transact_write_items()
        .set_transact_items(Some(items))
        .send()
        .await
    {
        Ok(_) => Ok(()),
        Err(err) => {
            if let Some(TransactWriteItemsError::TransactionCanceledException(tc)) =
                err.as_service_error()
            {
                let failed = tc
                    .cancellation_reasons()
                    .iter()
                    .position(|r| r.code() == Some("ConditionalCheckFailed"));
                if let Some(i) = failed {
                    let which = owners.get(i).copied().flatten();
                    return Err(StoreError::Conflict { which });
                }
            }
            Err(crate::error::classify(err))
        }
    }
}
