//! The files a skill's program brings (`PUT /v1/skills/{name}/files`): a
//! tar (or a gzip of one) judged once on upload, stored by its digest, and
//! staged into each sandbox that runs the program, under
//! `.skills/<skill>/` in its workspace, where its install steps run once
//! per version. What may be in it: directories and regular files with
//! relative names, nothing through `..`, no link, no device; a few MB.

use std::io::Read;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The largest upload taken (as sent: gzip or plain).
pub const MAX_UPLOAD_BYTES: usize = 4 * 1024 * 1024;
/// The largest archive once unpacked from gzip, and of its files together.
pub const MAX_UNPACKED_BYTES: u64 = 32 * 1024 * 1024;
/// The most members an archive may hold.
pub const MAX_MEMBERS: usize = 10_000;
/// The longest member name.
const MAX_NAME_BYTES: usize = 255;

/// A skill's files as its manifest records them: which version, by digest.
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkillFiles {
    /// The SHA-256 of the stored (plain) tar, hex.
    pub sha256: String,
    /// The stored tar's size.
    pub bytes: u64,
    /// Its regular files.
    pub files: u32,
}

/// Why an upload is refused: a code and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ArchiveError {
    pub code: &'static str,
    pub message: String,
}

fn refused(message: impl Into<String>) -> ArchiveError {
    ArchiveError {
        code: "INVALID_ARCHIVE",
        message: message.into(),
    }
}

fn too_large(message: impl Into<String>) -> ArchiveError {
    ArchiveError {
        code: "PAYLOAD_TOO_LARGE",
        message: message.into(),
    }
}

/// An upload judged: the plain tar to store, and what the manifest records.
#[derive(Debug, Clone)]
pub struct Judged {
    pub tar: Vec<u8>,
    pub files: SkillFiles,
}

/// Judges an upload: a gzip is unpacked (within [`MAX_UNPACKED_BYTES`]),
/// then every member of the tar is read and must be a directory or a
/// regular file under a relative name without `..`.
pub fn judge_upload(body: &[u8]) -> Result<Judged, ArchiveError> {
    if body.len() > MAX_UPLOAD_BYTES {
        return Err(too_large(format!(
            "the archive is over {MAX_UPLOAD_BYTES} bytes"
        )));
    }
    let tar = if body.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(body)
            .take(MAX_UNPACKED_BYTES + 1)
            .read_to_end(&mut out)
            .map_err(|e| refused(format!("the gzip cannot be read: {e}")))?;
        if out.len() as u64 > MAX_UNPACKED_BYTES {
            return Err(too_large(format!(
                "the archive unpacks to over {MAX_UNPACKED_BYTES} bytes"
            )));
        }
        out
    } else {
        body.to_vec()
    };
    let files = judge_tar(&tar)?;
    let sha256 = digest(&tar);
    Ok(Judged {
        files: SkillFiles {
            sha256,
            bytes: tar.len() as u64,
            files,
        },
        tar,
    })
}

/// Reads every member of a plain tar; returns how many regular files.
fn judge_tar(tar: &[u8]) -> Result<u32, ArchiveError> {
    if tar.len() < 512 {
        return Err(refused("the body is not a tar archive"));
    }
    let mut archive = tar::Archive::new(tar);
    let entries = archive
        .entries()
        .map_err(|e| refused(format!("the tar cannot be read: {e}")))?;
    let (mut members, mut files, mut total) = (0usize, 0u32, 0u64);
    for entry in entries {
        let entry = entry.map_err(|e| refused(format!("the tar cannot be read: {e}")))?;
        members += 1;
        if members > MAX_MEMBERS {
            return Err(too_large(format!(
                "the archive has over {MAX_MEMBERS} members"
            )));
        }
        let name = entry.path_bytes().into_owned();
        let shown = String::from_utf8_lossy(&name).into_owned();
        judge_name(&name).map_err(|why| refused(format!("member '{shown}' {why}")))?;
        match entry.header().entry_type() {
            tar::EntryType::Regular | tar::EntryType::Continuous => files += 1,
            tar::EntryType::Directory => {}
            // Extended headers carry names and times for the next member,
            // which is judged by that name.
            tar::EntryType::XHeader | tar::EntryType::XGlobalHeader => {}
            other => {
                return Err(refused(format!(
                    "member '{shown}' is a {other:?}: only directories and regular files are taken"
                )))
            }
        }
        total += entry.size();
        if total > MAX_UNPACKED_BYTES {
            return Err(too_large(format!(
                "the archive's files come to over {MAX_UNPACKED_BYTES} bytes"
            )));
        }
    }
    if members == 0 {
        return Err(refused("the archive is empty"));
    }
    Ok(files)
}

/// A member's name: relative, no `..`, no NUL, not too long.
pub fn judge_name(name: &[u8]) -> Result<(), &'static str> {
    if name.is_empty() || name.len() > MAX_NAME_BYTES {
        return Err("has an empty or too long name");
    }
    if name.starts_with(b"/") {
        return Err("has an absolute name");
    }
    if name.contains(&0) || name.contains(&b'\\') {
        return Err("has a name with a NUL or a backslash");
    }
    if name.split(|b| *b == b'/').any(|part| part == b"..") {
        return Err("has a name with '..'");
    }
    Ok(())
}

/// A version's name: the SHA-256 of its tar, hex.
pub fn digest(tar: &[u8]) -> String {
    hex::encode(Sha256::digest(tar))
}

/// Where an uploaded version is kept.
pub fn stored_key(skill: &str, sha256: &str) -> String {
    format!("skills/{skill}/files/{sha256}.tar")
}

/// Where a sandbox identity reads a version (copied there for it: a
/// sandbox reads only its own identity's objects).
pub fn staged_key(tenant: &str, agent: &str, sha256: &str) -> String {
    format!("sandboxes/{tenant}/{agent}/skills/{sha256}.tar")
}

/// The directory of a skill's program in the workspace.
pub fn skill_dir(skill: &str) -> String {
    format!(".skills/{skill}")
}

/// What a staged directory is marked with: its files' version and its
/// install steps (either changed: staged again).
pub fn stage_mark(files: Option<&str>, install: &[String]) -> String {
    let mut h = Sha256::new();
    h.update(files.unwrap_or("-").as_bytes());
    for step in install {
        h.update((step.len() as u64).to_be_bytes());
        h.update(step.as_bytes());
    }
    hex::encode(h.finalize())
}

#[cfg(test)]
#[path = "skill_files_tests.rs"]
mod tests;
