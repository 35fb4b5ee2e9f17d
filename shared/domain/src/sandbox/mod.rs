//! Sandbox policy as pure data (seed 000 §A–F, seed 001 §7–8): which skills
//! enter a sandbox, the resource limits and their caps, the port pool,
//! capability profiles and their resolution, and the mount policy. The
//! provider and the local data plane enforce what is resolved here; nothing
//! here does IO.
//!
//! - [`controls`]: what a sandbox reports in force, and what a profile needs
//! - [`credentials`]: a task's own AWS credentials and their renewal
//! - [`hand`]: the messages between the harness and a sandbox's agent
//! - [`lifecycle`]: one sandbox per agent identity: its record and transitions

pub mod access;
pub mod controls;
pub mod credentials;
pub mod hand;
pub mod lifecycle;
pub mod report;
pub mod seal;
mod starts;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The fields of a sandbox profile.
pub const PROFILE_FIELDS: [&str; 5] = [
    "extends",
    "read_only",
    "read_write",
    "deny",
    "restrict_network",
];

/// What a skill does, which decides where it runs (seed 000 §A).
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SkillKind {
    CodeExecution,
    ServiceDeployment,
    BuildInstall,
    LlmCall,
    DatabaseQuery,
    ExternalApi,
    TextProcessing,
    WebSearch,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Placement {
    /// In the agent's sandbox.
    Sandbox,
    /// In the harness: no sandbox is created for it.
    Inline,
}

impl SkillKind {
    /// The seed table: untrusted code, services on ports and builds run in
    /// a sandbox; model calls, queries, HTTP APIs, text and search do not.
    pub fn placement(self) -> Placement {
        match self {
            SkillKind::CodeExecution | SkillKind::ServiceDeployment | SkillKind::BuildInstall => {
                Placement::Sandbox
            }
            SkillKind::LlmCall
            | SkillKind::DatabaseQuery
            | SkillKind::ExternalApi
            | SkillKind::TextProcessing
            | SkillKind::WebSearch => Placement::Inline,
        }
    }
}

/// A manifest may ask for a sandbox where its kind would not need one
/// (e.g. web search through a headless browser), never the reverse.
pub fn placement(kind: SkillKind, manifest_requires_sandbox: bool) -> Placement {
    match (kind.placement(), manifest_requires_sandbox) {
        (Placement::Sandbox, _) | (Placement::Inline, true) => Placement::Sandbox,
        (Placement::Inline, false) => Placement::Inline,
    }
}

/// Defaults and caps of seed 000 §B.
pub const DEFAULT_CALL_TIMEOUT_S: u32 = 300;
pub const MAX_CALL_TIMEOUT_S: u32 = 1800;
pub const START_TIMEOUT_S: u32 = 30;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    pub cpu_millis: u32,
    pub memory_mb: u32,
    pub disk_mb: u32,
    pub call_timeout_s: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            cpu_millis: 1000,
            memory_mb: 2048,
            disk_mb: 1024,
            call_timeout_s: DEFAULT_CALL_TIMEOUT_S,
        }
    }
}

/// What a definition may raise the limits to.
pub const CAPS: Limits = Limits {
    cpu_millis: 4000,
    memory_mb: 8192,
    disk_mb: 10240,
    call_timeout_s: MAX_CALL_TIMEOUT_S,
};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} {value} is above the cap of {cap}")]
pub struct OverCap {
    pub field: &'static str,
    pub value: u32,
    pub cap: u32,
}

impl Limits {
    /// Checks every limit against its cap; zero is refused too.
    pub fn within_caps(self) -> Result<Limits, OverCap> {
        for (field, value, cap) in [
            ("cpu_millis", self.cpu_millis, CAPS.cpu_millis),
            ("memory_mb", self.memory_mb, CAPS.memory_mb),
            ("disk_mb", self.disk_mb, CAPS.disk_mb),
            ("call_timeout_s", self.call_timeout_s, CAPS.call_timeout_s),
        ] {
            if value == 0 || value > cap {
                return Err(OverCap { field, value, cap });
            }
        }
        Ok(self)
    }
}

/// The port pool: container ports 8081–8090, published on 39137–39146.
pub const CONTAINER_PORTS: std::ops::RangeInclusive<u16> = 8081..=8090;
const HOST_PORT_BASE: u16 = 39137;

pub fn host_port(container_port: u16) -> Option<u16> {
    CONTAINER_PORTS
        .contains(&container_port)
        .then(|| HOST_PORT_BASE + (container_port - CONTAINER_PORTS.start()))
}

/// The first free container port, or `None` when the pool is full (the
/// call then waits: seed 000 §D).
pub fn allocate_port(in_use: &[u16]) -> Option<u16> {
    CONTAINER_PORTS.clone().find(|p| !in_use.contains(p))
}

// ---------------------------------------------------------------- profiles

/// A profile as written in configuration.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ProfileDef {
    /// A built-in to start from (default `workspace`); never `off`/`none`
    /// and never another custom profile.
    #[serde(default)]
    pub extends: Option<String>,
    #[serde(default)]
    pub read_only: Vec<String>,
    #[serde(default)]
    pub read_write: Vec<String>,
    #[serde(default)]
    pub deny: Vec<String>,
    /// Unset, the base's network rule holds (`extends: strict` stays
    /// offline); only an explicit `false` lifts it.
    #[serde(default)]
    pub restrict_network: Option<bool>,
}

impl ProfileDef {
    /// A profile as written in a request; errors name the field under
    /// `field`, and an unknown field is refused, never ignored.
    pub fn parse(v: &serde_json::Value, field: &str) -> Result<Self, crate::fields::FieldError> {
        use crate::fields::{FieldError, Fields};
        let serde_json::Value::Object(o) = v else {
            return Err(FieldError::new(field, "must be an object"));
        };
        let f = Fields::nested(o, field)?;
        f.only(&PROFILE_FIELDS)?;
        Ok(ProfileDef {
            extends: f.opt_str("extends")?.map(str::to_string),
            read_only: f.opt_str_list("read_only")?.unwrap_or_default(),
            read_write: f.opt_str_list("read_write")?.unwrap_or_default(),
            deny: f.opt_str_list("deny")?.unwrap_or_default(),
            restrict_network: f.opt_bool("restrict_network")?,
        })
    }
}

/// What a sandbox may do, resolved from a profile: this, not the profile's
/// name, is what gets enforced and reported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CapabilitySet {
    pub profile: String,
    /// Whether the whole filesystem is readable by default.
    pub read_all: bool,
    pub readable: Vec<String>,
    pub writable: Vec<String>,
    pub deny: Vec<String>,
    pub restrict_network: bool,
    /// `false` only for `off`: nothing is applied, and that is recorded.
    pub enforce: bool,
}

/// Symbolic roots the data plane maps to real paths.
pub const WORKSPACE: &str = "$WORKSPACE";
pub const HOME: &str = "$HOME";
pub const TMP: &str = "$TMP";
pub const SYSTEM: &str = "$SYSTEM";
pub const DEVICES: &str = "$DEVICES";

fn builtin(name: &str) -> Option<CapabilitySet> {
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let set = |read_all, readable: &[&str], writable: &[&str], restrict_network| CapabilitySet {
        profile: name.to_string(),
        read_all,
        readable: s(readable),
        writable: s(writable),
        deny: vec![],
        restrict_network,
        enforce: true,
    };
    match name {
        "workspace" => Some(set(true, &[], &[WORKSPACE, HOME, TMP], false)),
        // Broad write under the enumerated roots, except /data (other
        // users) — seed 001 §7.2.
        "devbox" => Some(CapabilitySet {
            deny: s(&["/data"]),
            ..set(
                true,
                &[],
                &[
                    "/opt",
                    "/srv",
                    "/usr/local",
                    "/var/tmp",
                    WORKSPACE,
                    HOME,
                    TMP,
                ],
                false,
            )
        }),
        "read-only" | "readonly" => Some(set(true, &[], &[HOME, TMP, DEVICES], true)),
        "strict" => Some(set(
            false,
            &[SYSTEM, WORKSPACE],
            &[WORKSPACE, HOME, TMP],
            true,
        )),
        "off" | "none" => Some(CapabilitySet {
            enforce: false,
            ..set(true, &[], &[], false)
        }),
        _ => None,
    }
}

fn is_off(name: &str) -> bool {
    matches!(name, "off" | "none")
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProfileError {
    #[error("profile '{0}' is not defined")]
    Unknown(String),
    #[error("profile '{0}' extends off/none, which is not a base")]
    ExtendsOff(String),
    #[error(
        "profile '{0}' extends the custom profile '{1}'; custom profiles extend built-ins only"
    )]
    ExtendsCustom(String, String),
    #[error("profile '{0}' extends unknown profile '{1}'")]
    ExtendsUnknown(String, String),
    #[error("profile name '{0}' is a built-in and cannot be redefined")]
    RedefinesBuiltin(String),
}

/// Profiles from global configuration, then project configuration. The
/// global set is read first and wins: a project may only add new names, so
/// a repository cannot weaken a profile the user defined.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Profiles {
    defs: BTreeMap<String, ProfileDef>,
    /// Project entries refused because the name was already defined globally.
    pub shadowed: Vec<String>,
}

impl Profiles {
    pub fn load(
        global: BTreeMap<String, ProfileDef>,
        project: BTreeMap<String, ProfileDef>,
    ) -> Result<Self, ProfileError> {
        let mut defs = BTreeMap::new();
        let mut shadowed = Vec::new();
        for (name, def) in global {
            if builtin(&name).is_some() {
                return Err(ProfileError::RedefinesBuiltin(name));
            }
            defs.insert(name, def);
        }
        for (name, def) in project {
            if builtin(&name).is_some() {
                return Err(ProfileError::RedefinesBuiltin(name));
            }
            match defs.entry(name) {
                std::collections::btree_map::Entry::Vacant(v) => {
                    v.insert(def);
                }
                std::collections::btree_map::Entry::Occupied(o) => shadowed.push(o.key().clone()),
            }
        }
        Ok(Profiles { defs, shadowed })
    }

    pub fn resolve(&self, name: &str) -> Result<CapabilitySet, ProfileError> {
        if let Some(b) = builtin(name) {
            return Ok(b);
        }
        let def = self
            .defs
            .get(name)
            .ok_or_else(|| ProfileError::Unknown(name.to_string()))?;
        let base = def.extends.as_deref().unwrap_or("workspace");
        if is_off(base) {
            return Err(ProfileError::ExtendsOff(name.to_string()));
        }
        if self.defs.contains_key(base) {
            return Err(ProfileError::ExtendsCustom(
                name.to_string(),
                base.to_string(),
            ));
        }
        let mut set = builtin(base)
            .ok_or_else(|| ProfileError::ExtendsUnknown(name.to_string(), base.to_string()))?;
        set.profile = name.to_string();
        set.readable.extend(def.read_only.iter().cloned());
        set.writable.extend(def.read_write.iter().cloned());
        set.deny.extend(def.deny.iter().cloned());
        // Inherited from the base unless the profile says otherwise: a
        // custom `strict` must not quietly go online.
        set.restrict_network = def.restrict_network.unwrap_or(set.restrict_network);
        Ok(set)
    }
}

// ---------------------------------------------------------------- mounts

#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MountMode {
    Ro,
    Rw,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MountError {
    #[error("mount {0} is refused: it exposes the host ({1})")]
    Forbidden(String, &'static str),
    #[error("mount {0} is outside the user's workspace")]
    OutsideWorkspace(String),
    #[error("mount {0} is not a normalised absolute path")]
    NotNormal(String),
}

fn user_workspace(user_id: &str) -> String {
    format!("/data/users/{user_id}/workspace")
}

/// Checks one bind mount for a sandbox of `user_id` (seed 000 §F). Only the
/// user's workspace and exact sub-paths of it may be mounted; a rw sub-path
/// is destructive (it needs an approval). Returns whether it is destructive.
pub fn check_mount(path: &str, mode: MountMode, user_id: &str) -> Result<bool, MountError> {
    let normal = path.starts_with('/')
        && !path.split('/').any(|seg| seg == ".." || seg == ".")
        && !path.contains("//")
        && (path == "/" || !path.ends_with('/'));
    if !normal {
        return Err(MountError::NotNormal(path.to_string()));
    }
    const FORBIDDEN: [(&str, &str); 6] = [
        ("/var/run/docker.sock", "the container runtime socket"),
        ("/run/docker.sock", "the container runtime socket"),
        ("/proc", "/proc"),
        ("/sys", "/sys and cgroupfs"),
        ("/etc", "/etc"),
        ("/home", "/home"),
    ];
    if path == "/" {
        return Err(MountError::Forbidden(path.into(), "the root filesystem"));
    }
    for (p, why) in FORBIDDEN {
        if path == p || path.starts_with(&format!("{p}/")) {
            return Err(MountError::Forbidden(path.into(), why));
        }
    }
    let ws = user_workspace(user_id);
    if path == ws {
        return Ok(false);
    }
    if path.starts_with(&format!("{ws}/")) {
        return Ok(mode == MountMode::Rw);
    }
    Err(MountError::OutsideWorkspace(path.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placement_follows_the_seed_table_and_only_gets_stricter() {
        assert_eq!(
            placement(SkillKind::CodeExecution, false),
            Placement::Sandbox
        );
        assert_eq!(
            placement(SkillKind::BuildInstall, false),
            Placement::Sandbox
        );
        assert_eq!(placement(SkillKind::LlmCall, false), Placement::Inline);
        assert_eq!(placement(SkillKind::WebSearch, true), Placement::Sandbox);
    }

    #[test]
    fn limits_and_ports() {
        assert!(Limits::default().within_caps().is_ok());
        let too_long = Limits {
            call_timeout_s: 3600,
            ..Limits::default()
        };
        assert_eq!(too_long.within_caps().unwrap_err().field, "call_timeout_s");
        assert_eq!(host_port(8081), Some(39137));
        assert_eq!(host_port(8090), Some(39146));
        assert_eq!(host_port(8080), None);
        let all: Vec<u16> = CONTAINER_PORTS.collect();
        assert_eq!(allocate_port(&all), None);
        assert_eq!(allocate_port(&[8081]), Some(8082));
    }

    fn def(extends: Option<&str>) -> ProfileDef {
        ProfileDef {
            extends: extends.map(str::to_string),
            ..ProfileDef::default()
        }
    }

    #[test]
    fn builtins_are_what_their_capability_sets_say() {
        let p = Profiles::default();
        let ws = p.resolve("workspace").unwrap();
        assert!(ws.read_all && ws.writable.contains(&WORKSPACE.to_string()));
        let strict = p.resolve("strict").unwrap();
        assert!(!strict.read_all, "strict is strict about reading");
        assert!(
            strict.writable.contains(&WORKSPACE.to_string()),
            "strict still writes the workspace"
        );
        let ro = p.resolve("read-only").unwrap();
        assert!(
            !ro.writable.contains(&WORKSPACE.to_string()) && ro.writable.contains(&TMP.to_string())
        );
        assert!(!p.resolve("off").unwrap().enforce);
        assert!(!p.resolve("none").unwrap().enforce);
    }

    #[test]
    fn custom_profiles_extend_builtins_only_and_inherit_the_network_rule() {
        let mut global = BTreeMap::new();
        global.insert(
            "ci".to_string(),
            ProfileDef {
                extends: Some("strict".into()),
                read_write: vec!["/cache".into()],
                ..ProfileDef::default()
            },
        );
        global.insert("bad-off".to_string(), def(Some("none")));
        global.insert("chained".to_string(), def(Some("ci")));
        let p = Profiles::load(global, BTreeMap::new()).unwrap();
        let ci = p.resolve("ci").unwrap();
        assert!(!ci.read_all && ci.writable.contains(&"/cache".to_string()));
        assert!(ci.restrict_network, "extends strict stays offline");
        let online = ProfileDef {
            extends: Some("strict".into()),
            restrict_network: Some(false),
            ..ProfileDef::default()
        };
        let p2 = Profiles::load(BTreeMap::from([("o".into(), online)]), BTreeMap::new()).unwrap();
        assert!(
            !p2.resolve("o").unwrap().restrict_network,
            "only an explicit false lifts it"
        );
        assert!(matches!(
            p.resolve("bad-off"),
            Err(ProfileError::ExtendsOff(_))
        ));
        assert!(matches!(
            p.resolve("chained"),
            Err(ProfileError::ExtendsCustom(_, _))
        ));
        assert!(matches!(p.resolve("nope"), Err(ProfileError::Unknown(_))));
        let default_base =
            Profiles::load(BTreeMap::from([("x".into(), def(None))]), BTreeMap::new())
                .unwrap()
                .resolve("x")
                .unwrap();
        assert!(
            default_base.read_all,
            "custom profiles start from workspace"
        );
    }

    #[test]
    fn a_project_cannot_weaken_a_global_profile_of_the_same_name() {
        let global = BTreeMap::from([(
            "team".to_string(),
            ProfileDef {
                extends: Some("strict".into()),
                restrict_network: Some(true),
                ..ProfileDef::default()
            },
        )]);
        let project = BTreeMap::from([
            (
                "team".to_string(),
                ProfileDef {
                    extends: Some("devbox".into()),
                    ..ProfileDef::default()
                },
            ),
            ("extra".to_string(), def(Some("read-only"))),
        ]);
        let p = Profiles::load(global, project).unwrap();
        let team = p.resolve("team").unwrap();
        assert!(
            !team.read_all && team.restrict_network,
            "the global definition holds"
        );
        assert_eq!(p.shadowed, vec!["team".to_string()]);
        assert!(p.resolve("extra").is_ok(), "new names are added");
        assert!(matches!(
            Profiles::load(BTreeMap::new(), BTreeMap::from([("off".into(), def(None))])),
            Err(ProfileError::RedefinesBuiltin(_))
        ));
    }

    #[test]
    fn mounts_are_refused_outside_the_users_workspace() {
        use MountMode::*;
        assert_eq!(check_mount("/data/users/u1/workspace", Rw, "u1"), Ok(false));
        assert_eq!(
            check_mount("/data/users/u1/workspace/repo/src", Ro, "u1"),
            Ok(false)
        );
        assert_eq!(
            check_mount("/data/users/u1/workspace/repo/src", Rw, "u1"),
            Ok(true)
        );
        for bad in [
            "/",
            "/etc",
            "/etc/passwd",
            "/home/u1",
            "/proc",
            "/sys/fs/cgroup",
            "/var/run/docker.sock",
        ] {
            assert!(
                matches!(check_mount(bad, Ro, "u1"), Err(MountError::Forbidden(..))),
                "{bad}"
            );
        }
        assert!(matches!(
            check_mount("/data/users/u2/workspace", Ro, "u1"),
            Err(MountError::OutsideWorkspace(_))
        ));
        assert!(matches!(
            check_mount("/data/users/u1/workspace/../../u2", Ro, "u1"),
            Err(MountError::NotNormal(_))
        ));
        assert!(matches!(
            check_mount("relative", Ro, "u1"),
            Err(MountError::NotNormal(_))
        ));
    }
}
