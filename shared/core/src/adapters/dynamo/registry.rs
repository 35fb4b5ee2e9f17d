//! The registry table: agent definitions (`agent#<name>`), teams
//! (`team#<name>`), skills, profiles and API keys (`apikey#<key_id>`, the
//! secret's hash only), the salt of each tenant's callback signing secret
//! (`tenant#<t>#callback`; the secret is derived, never stored). A `kind` attribute and the
//! `by_kind` index list them.

use aws_sdk_dynamodb::Client;

use std::collections::BTreeMap;

use armada_domain::agent::AgentDefinition;
use armada_domain::api::KeyRole;
use armada_domain::sandbox::ProfileDef;
use armada_domain::skills::SkillManifest;
use armada_domain::team::TeamDefinition;

use super::item::{get_json, get_s, json, n, opt_s, s, Item};
use crate::error::{classify, StoreError};
use crate::ports;

use async_trait::async_trait;

#[derive(Debug, Clone)]
pub struct Registry {
    dynamo: Client,
    table: String,
}

pub use crate::ports::StoredKey;

impl Registry {
    pub fn new(dynamo: Client, table: &str) -> Self {
        Registry {
            dynamo,
            table: table.to_string(),
        }
    }

    async fn get(&self, pk: &str) -> Result<Option<Item>, StoreError> {
        let out = self
            .dynamo
            .get_item()
            .table_name(&self.table)
            .key("pk", s(pk))
            .send()
            .await
            .map_err(classify)?;
        Ok(out.item().cloned())
    }

    /// Creates or replaces a `<kind>#<name>` item holding `doc`.
    async fn put_doc(
        &self,
        kind: &str,
        name: &str,
        doc: &impl serde::Serialize,
    ) -> Result<(), StoreError> {
        let mut item = Item::new();
        item.insert("pk".into(), s(format!("{kind}#{name}")));
        item.insert("kind".into(), s(kind));
        item.insert("name".into(), s(name));
        item.insert("doc".into(), json(doc));
        self.put_item(item).await
    }

    /// Creates or replaces an item.
    async fn put_item(&self, item: Item) -> Result<(), StoreError> {
        self.dynamo
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .send()
            .await
            .map_err(classify)?;
        Ok(())
    }

    /// Deletes an item; `false` when there was none.
    async fn delete(&self, pk: &str) -> Result<bool, StoreError> {
        let out = self
            .dynamo
            .delete_item()
            .table_name(&self.table)
            .key("pk", s(pk))
            .return_values(aws_sdk_dynamodb::types::ReturnValue::AllOld)
            .send()
            .await
            .map_err(classify)?;
        Ok(out.attributes().is_some())
    }

    /// Every item of a kind (the `by_kind` index), all pages.
    async fn of_kind(&self, kind: &str) -> Result<Vec<Item>, StoreError> {
        self.dynamo
            .query()
            .table_name(&self.table)
            .index_name("by_kind")
            .key_condition_expression("kind = :k")
            .expression_attribute_values(":k", s(kind))
            .into_paginator()
            .items()
            .send()
            .collect::<Result<Vec<Item>, _>>()
            .await
            .map_err(classify)
    }
}

#[async_trait]
impl ports::Registry for Registry {
    async fn agent(&self, name: &str) -> Result<Option<AgentDefinition>, StoreError> {
        self.get(&format!("agent#{name}"))
            .await?
            .map(|i| get_json(&i, "doc"))
            .transpose()
    }

    /// Creates or replaces an agent; the stored version is incremented
    /// atomically and returned.
    async fn put_agent(&self, def: &AgentDefinition) -> Result<u64, StoreError> {
        self.write_agent(def, None).await
    }

    async fn put_agent_if(&self, def: &AgentDefinition, version: u64) -> Result<u64, StoreError> {
        self.write_agent(def, Some(version)).await
    }

    async fn list_agents(&self) -> Result<Vec<(AgentDefinition, u64)>, StoreError> {
        self.list_agent_items().await
    }

    async fn agent_version(
        &self,
        name: &str,
    ) -> Result<Option<(AgentDefinition, u64)>, StoreError> {
        match self.get(&format!("agent#{name}")).await? {
            None => Ok(None),
            Some(i) => Ok(Some((
                get_json(&i, "doc")?,
                super::item::get_n(&i, "version").unwrap_or(1),
            ))),
        }
    }

    /// Removes an agent definition; whether there was one.
    async fn delete_agent(&self, name: &str) -> Result<bool, StoreError> {
        self.delete(&format!("agent#{name}")).await
    }

    async fn team(&self, name: &str) -> Result<Option<TeamDefinition>, StoreError> {
        self.get(&format!("team#{name}"))
            .await?
            .map(|i| get_json(&i, "doc"))
            .transpose()
    }

    async fn put_team(&self, def: &TeamDefinition) -> Result<(), StoreError> {
        self.put_doc("team", &def.name, def).await
    }

    async fn list_teams(&self) -> Result<Vec<TeamDefinition>, StoreError> {
        self.of_kind("team")
            .await?
            .iter()
            .map(|i| get_json(i, "doc"))
            .collect()
    }

    async fn delete_team(&self, name: &str) -> Result<bool, StoreError> {
        self.delete(&format!("team#{name}")).await
    }

    /// The global sandbox profiles (custom profiles defined platform-wide;
    /// they win over any agent's project profiles of the same name).
    async fn profiles(&self) -> Result<BTreeMap<String, ProfileDef>, StoreError> {
        self.of_kind("profile")
            .await?
            .iter()
            .map(|item| Ok((get_s(item, "name")?, get_json(item, "doc")?)))
            .collect()
    }

    /// A skill manifest defined in the registry (built-ins are not here).
    async fn skill(&self, name: &str) -> Result<Option<SkillManifest>, StoreError> {
        self.get(&format!("skill#{name}"))
            .await?
            .map(|i| get_json(&i, "doc"))
            .transpose()
    }

    async fn put_skill(&self, m: &SkillManifest) -> Result<(), StoreError> {
        self.put_doc("skill", &m.name, m).await
    }

    async fn list_skills(&self) -> Result<Vec<SkillManifest>, StoreError> {
        self.of_kind("skill")
            .await?
            .iter()
            .map(|i| get_json(i, "doc"))
            .collect()
    }

    async fn put_profile(&self, name: &str, def: &ProfileDef) -> Result<(), StoreError> {
        self.put_doc("profile", name, def).await
    }

    async fn put_key(&self, key: &StoredKey, now_ms: i64) -> Result<(), StoreError> {
        let mut item = Item::new();
        item.insert("pk".into(), s(format!("apikey#{}", key.key_id)));
        item.insert("kind".into(), s("apikey"));
        item.insert("name".into(), s(&key.key_id));
        item.insert("tenant".into(), s(&key.tenant));
        item.insert("secret_sha256".into(), s(&key.secret_sha256));
        item.insert("role".into(), s(key.role.as_str()));
        if let Some(owner) = &key.owner {
            item.insert("owner".into(), s(owner));
        }
        item.insert("created_at".into(), n(now_ms));
        super::item::put_new(&self.dynamo, &self.table, item, "pk").await
    }

    async fn key(&self, key_id: &str) -> Result<Option<StoredKey>, StoreError> {
        let Some(item) = self.get(&format!("apikey#{key_id}")).await? else {
            return Ok(None);
        };
        Ok(Some(StoredKey {
            key_id: key_id.to_string(),
            tenant: get_s(&item, "tenant")?,
            secret_sha256: get_s(&item, "secret_sha256")?,
            revoked: opt_s(&item, "revoked_at").is_some(),
            // Keys minted before roles are members.
            role: opt_s(&item, "role")
                .and_then(|r| KeyRole::parse(&r))
                .unwrap_or_default(),
            owner: opt_s(&item, "owner"),
        }))
    }

    async fn callback_salt(&self, tenant: &str) -> Result<Option<String>, StoreError> {
        Ok(self
            .get(&format!("tenant#{tenant}#callback"))
            .await?
            .and_then(|i| opt_s(&i, "salt")))
    }

    async fn put_callback_salt(
        &self,
        tenant: &str,
        salt: &str,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let mut item = Item::new();
        item.insert("pk".into(), s(format!("tenant#{tenant}#callback")));
        item.insert("kind".into(), s("callback_secret"));
        item.insert("name".into(), s(tenant));
        item.insert("salt".into(), s(salt));
        item.insert("rotated_at".into(), n(now_ms));
        self.put_item(item).await
    }

    /// Marks a key revoked; `Conflict` when there is no such key.
    async fn revoke_key(&self, key_id: &str, now_ms: i64) -> Result<(), StoreError> {
        self.dynamo
            .update_item()
            .table_name(&self.table)
            .key("pk", s(format!("apikey#{key_id}")))
            .update_expression("SET revoked_at = :now")
            .condition_expression("attribute_exists(pk)")
            .expression_attribute_values(":now", s(now_ms.to_string()))
            .send()
            .await
            .map_err(classify)?;
        Ok(())
    }
}

impl Registry {
    /// Writes an agent's definition, adding one to its version; with
    /// `expected`, only while the stored version is that one.
    async fn write_agent(
        &self,
        def: &AgentDefinition,
        expected: Option<u64>,
    ) -> Result<u64, StoreError> {
        let mut write = self
            .dynamo
            .update_item()
            .table_name(&self.table)
            .key("pk", s(format!("agent#{}", def.name)))
            .update_expression("SET kind = :k, #name = :n, doc = :d ADD version :one")
            .expression_attribute_names("#name", "name")
            .expression_attribute_values(":k", s("agent"))
            .expression_attribute_values(":n", s(&def.name))
            .expression_attribute_values(":d", json(def))
            .expression_attribute_values(":one", n(1))
            .return_values(aws_sdk_dynamodb::types::ReturnValue::UpdatedNew);
        if let Some(v) = expected {
            write = write
                .condition_expression("version = :expected")
                .expression_attribute_values(":expected", n(v));
        }
        let out = write.send().await.map_err(classify)?;
        let version = out
            .attributes()
            .and_then(|a| a.get("version"))
            .and_then(|v| v.as_n().ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or(1);
        Ok(version)
    }

    async fn list_agent_items(&self) -> Result<Vec<(AgentDefinition, u64)>, StoreError> {
        self.of_kind("agent")
            .await?
            .iter()
            .map(|item| {
                let def: AgentDefinition = get_json(item, "doc")?;
                Ok((def, super::item::get_n(item, "version").unwrap_or(1)))
            })
            .collect()
    }
}
