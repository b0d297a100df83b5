//! The id of one entity: one NATS subject token.

use std::fmt;
use std::sync::Arc;

use crate::error::InvalidId;

/// The longest entity id accepted, in bytes.
pub const MAX_ID_LEN: usize = 256;

/// The id of one entity: exactly one NATS subject token.
///
/// Non-empty, at most [`MAX_ID_LEN`] bytes, printable, no whitespace and none of `.`, `*`, `>`.
/// Cheap to clone.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EntityId(Arc<str>);

impl EntityId {
    /// Validates `id` as one subject token.
    ///
    /// # Errors
    /// [`InvalidId`] saying what is wrong with it.
    pub fn new(id: impl AsRef<str>) -> Result<Self, InvalidId> {
        let id = id.as_ref();
        if id.is_empty() {
            return Err(InvalidId::Empty);
        }
        if id.len() > MAX_ID_LEN {
            return Err(InvalidId::TooLong {
                len: id.len(),
                max: MAX_ID_LEN,
            });
        }
        if let Some(found) = id
            .chars()
            .find(|c| matches!(c, '.' | '*' | '>') || c.is_whitespace() || c.is_control())
        {
            return Err(InvalidId::ForbiddenChar {
                id: id.to_owned(),
                found,
            });
        }
        Ok(Self(Arc::from(id)))
    }

    /// The id as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for EntityId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for EntityId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl std::borrow::Borrow<str> for EntityId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl TryFrom<&str> for EntityId {
    type Error = InvalidId;
    fn try_from(id: &str) -> Result<Self, InvalidId> {
        Self::new(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_token_is_a_valid_id() {
        assert_eq!(EntityId::new("o-17_x:y").unwrap().as_str(), "o-17_x:y");
    }

    #[test]
    fn ids_that_are_not_one_token_are_rejected() {
        assert_eq!(EntityId::new(""), Err(InvalidId::Empty));
        for bad in ["a.b", "a*", ">", "a b", "a\tb", "a\nb", "\u{7f}"] {
            assert!(
                matches!(EntityId::new(bad), Err(InvalidId::ForbiddenChar { .. })),
                "{bad:?}"
            );
        }
        let long = "x".repeat(MAX_ID_LEN + 1);
        assert_eq!(
            EntityId::new(&long),
            Err(InvalidId::TooLong {
                len: MAX_ID_LEN + 1,
                max: MAX_ID_LEN
            })
        );
        assert!(EntityId::new("x".repeat(MAX_ID_LEN)).is_ok());
    }
}
