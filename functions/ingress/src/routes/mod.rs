//! The API's resources, one module each; `crate::route` maps paths to them.

pub(crate) mod agents;
pub(crate) mod collab;
pub(crate) mod keys;
pub(crate) mod profiles;
pub(crate) mod runs;
pub(crate) mod sandboxes;
pub(crate) mod sessions;
pub(crate) mod skills;
pub(crate) mod teams;
