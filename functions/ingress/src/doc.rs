//! The document's frame: its title, the keys it is called with, and the
//! refusals most operations share. Each operation's own entry is the
//! `#[utoipa::path]` on its handler.

use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::{Modify, OpenApi};

use armada_api::ErrorBody;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Armada API",
        version = "1",
        description = "Run AI agents: start Runs, follow their events, hold sessions, decide \
                       approvals, and manage agents, teams, skills, profiles, sandboxes and keys. \
                       Every error is `{\"error\": {\"code\", \"message\"}}` with a stable code.",
        license(name = "Apache-2.0", identifier = "Apache-2.0")
    ),
    modifiers(&Keys),
    components(schemas(ErrorBody)),
    tags(
        (name = "runs", description = "Runs: start, read, events, cancel"),
        (name = "collaboration", description = "A Run's tree, its children, relay chains"),
        (name = "sessions", description = "Multi-turn conversations with one agent"),
        (name = "approvals", description = "Human decisions on risky or uncertain tool calls"),
        (name = "registry", description = "Agents, teams, skills and sandbox profiles (admin writes)"),
        (name = "sandboxes", description = "A tenant's per-agent sandboxes"),
        (name = "keys", description = "API keys and callback secrets"),
        (name = "hooks", description = "Inbound webhooks: GitHub, Standard Webhooks, Alertmanager"),
        (name = "schedules", description = "Runs at the times an EventBridge Scheduler expression names"),
        (name = "mailboxes", description = "Addresses whose mail starts Runs, answered in the sender's thread"),
        (name = "secrets", description = "A tenant's secrets: written, listed by name, never read back"),
        (name = "meta", description = "Health and this document"),
    )
)]
pub struct ApiDoc;

/// The three kinds of key, all `Authorization: Bearer <key>`: the
/// deployment's admin key, a tenant's `member` key and a tenant's
/// `approver` key. An operation open to several lists each.
struct Keys;

impl Modify for Keys {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        for (name, what) in [
            (
                "admin_key",
                "The deployment's admin key: agents, teams, skills, profiles, keys.",
            ),
            (
                "member_key",
                "A tenant's key (role `member`): its Runs, sessions, approvals.",
            ),
            (
                "approver_key",
                "A tenant's key with the `approver` role: also decides the tenant's approvals.",
            ),
        ] {
            let mut http = Http::new(HttpAuthScheme::Bearer);
            http.description = Some(what.to_string());
            components.add_security_scheme(name, SecurityScheme::Http(http));
        }
    }
}
