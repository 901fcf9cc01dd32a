//! The resolved, checked model: every package with its types in source order
//! and its service versions as manifests. Built by `check` only when a
//! contract set has no errors; immutable afterwards.

use crate::manifest::{Manifest, PackageContract};

#[derive(Debug, Clone, PartialEq)]
pub struct Model {
    /// Sorted by package name.
    pub packages: Vec<PackageContract>,
}

impl Model {
    /// Every service version's manifest, in package order.
    pub fn manifests(&self) -> impl Iterator<Item = &Manifest> {
        self.packages.iter().flat_map(|p| p.services.iter())
    }

    pub fn package(&self, name: &str) -> Option<&PackageContract> {
        self.packages.iter().find(|p| p.package == name)
    }
}
