//! T1 ingress: the HTTP API v1. It authenticates, validates, deduplicates,
//! writes the request and enqueues it for the dispatcher; it never runs an
//! agent. One axum [`Router`] serves it, under `lambda_http` in AWS and
//! behind the local stack's HTTP server (which hands it the same API
//! Gateway events). The router and the OpenAPI document are built from
//! the same `routes!`, so a route cannot be missing from the document.

use std::sync::Arc;

use axum::Router;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use armada_core::Services;

mod doc;
mod routes;

pub use doc::ApiDoc;
pub use routes::runs::run_view;

/// Bodies above this are refused with 413.
pub use armada_api::server::MAX_BODY_BYTES;

/// Every route of the API, each with its entry in the document.
fn api() -> OpenApiRouter<Arc<Services>> {
    use routes::{
        agents, artifacts, callbacks, collab, health, hooks, inbound, keys, mailboxes, profiles,
        runs, sandboxes, schedules, secrets, sessions, skills, teams,
    };
    OpenApiRouter::with_openapi(<ApiDoc as utoipa::OpenApi>::openapi())
        .routes(routes!(health::health))
        .routes(routes!(health::openapi_json))
        .routes(routes!(runs::create_run))
        .routes(routes!(runs::get_run))
        .routes(routes!(runs::run_events))
        .routes(routes!(artifacts::get_artifact))
        .routes(routes!(runs::cancel_run))
        .routes(routes!(callbacks::redeliver_callback))
        .routes(routes!(collab::run_trace))
        .routes(routes!(collab::run_children))
        .routes(routes!(collab::get_chain))
        .routes(routes!(collab::cancel_chain))
        .routes(routes!(sessions::create_session))
        .routes(routes!(sessions::get_session))
        .routes(routes!(sessions::session_message))
        .routes(routes!(agents::list_agents))
        .routes(routes!(
            agents::get_agent,
            agents::put_agent,
            agents::delete_agent
        ))
        .routes(routes!(agents::refresh_tools))
        .routes(routes!(teams::list_teams))
        .routes(routes!(
            teams::get_team,
            teams::put_team,
            teams::delete_team
        ))
        .routes(routes!(profiles::list_profiles))
        .routes(routes!(profiles::put_profile))
        .routes(routes!(skills::list_skills))
        .routes(routes!(skills::get_skill, skills::put_skill))
        .routes(routes!(skills::put_skill_files))
        .routes(routes!(sandboxes::list_sandboxes))
        .routes(routes!(sandboxes::get_sandbox, sandboxes::destroy_sandbox))
        .routes(routes!(keys::mint_key))
        .routes(routes!(keys::rotate_callback_secret))
        .routes(routes!(keys::revoke_key))
        .routes(routes!(hooks::create_hook, hooks::list_hooks))
        .routes(routes!(
            hooks::get_hook,
            hooks::patch_hook,
            hooks::delete_hook,
            inbound::deliver
        ))
        .routes(routes!(hooks::rotate_hook))
        .routes(routes!(hooks::hook_deliveries))
        .routes(routes!(
            schedules::create_schedule,
            schedules::list_schedules
        ))
        .routes(routes!(
            schedules::get_schedule,
            schedules::patch_schedule,
            schedules::delete_schedule
        ))
        .routes(routes!(schedules::schedule_firings))
        .routes(routes!(
            mailboxes::create_mailbox,
            mailboxes::list_mailboxes
        ))
        .routes(routes!(
            mailboxes::get_mailbox,
            mailboxes::patch_mailbox,
            mailboxes::delete_mailbox
        ))
        .routes(routes!(mailboxes::mailbox_deliveries))
        .routes(routes!(secrets::list_secrets))
        .routes(routes!(secrets::put_secret, secrets::delete_secret))
}

/// The API's router, ready to serve.
pub fn app(svc: Arc<Services>) -> Router {
    armada_core::http::serve(api(), svc)
}

/// This function's part of the OpenAPI document.
pub fn openapi() -> utoipa::openapi::OpenApi {
    armada_core::http::document(api())
}

#[cfg(test)]
mod hook_tests;
#[cfg(test)]
mod limit_tests;
#[cfg(test)]
mod mailbox_tests;
#[cfg(test)]
mod schedule_tests;
#[cfg(test)]
mod secret_tests;
#[cfg(test)]
mod tests;
