//! The names the platform is addressed by: agents, teams, skills and
//! profiles (`valid_name`), and tenants (`valid_tenant`). A leaf: it
//! depends on nothing, so every module that checks a name can use it.

/// An agent's, team's, skill's or profile's name: 1-64 characters of
/// a-z, 0-9, '-' or '_', beginning with a letter or digit (the OpenAPI
/// document's pattern `^[a-z0-9][a-z0-9_-]{0,63}$`).
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
        && name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric())
}

/// A tenant's name: 1-64 characters of a-z, 0-9 or '-' (the document's
/// `^[a-z0-9-]{1,64}$`).
pub fn valid_tenant(t: &str) -> bool {
    !t.is_empty()
        && t.len() <= 64
        && t.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_short_lowercase_and_begin_with_a_letter_or_digit() {
        for ok in ["a", "coder", "team_1", "x-y", &"a".repeat(64)] {
            assert!(valid_name(ok), "{ok}");
        }
        for bad in ["", "-a", "_a", "A", "a b", "a.b", &"a".repeat(65)] {
            assert!(!valid_name(bad), "{bad}");
        }
        assert!(valid_tenant("acme-1") && valid_tenant("-"));
        assert!(!valid_tenant("") && !valid_tenant("a_b") && !valid_tenant(&"a".repeat(65)));
    }
}
