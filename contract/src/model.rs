//! The resolved, checked model: every package with its types and its
//! service versions as manifests. Built by `check` only when a contract set
//! has no errors; immutable afterwards.
//!
//! **Order** (deterministic): packages sorted by name; inside a package,
//! types and services in file load order (roots in the order given, each
//! followed depth-first by its imports), then source order. Type references
//! are fully qualified (`common.Money`); optional fields and parameters have
//! a [`TypeRef::Optional`](crate::manifest::TypeRef) type. Which fields need
//! a `Box` in Rust is decided by the generator from the manifests alone, so
//! a manifest fetched from a registry gets the same answer as a local file.

use crate::manifest::{Manifest, PackageContract, TypeDef};

/// A checked contract set: its packages, each with its records, enums and
/// service-version manifests (see the module docs for the order).
///
/// Produced by [`check_paths`](crate::check::check_paths) only when no
/// error was found, so every rule of the language holds: names resolve,
/// nothing collides in generated code, no record contains itself through
/// required fields.
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

    /// A package by its dotted name (`hr.employees`).
    pub fn package(&self, name: &str) -> Option<&PackageContract> {
        self.packages.iter().find(|p| p.package == name)
    }

    /// The manifest of one interface version: `service("hr.employees.EmpService", 1)`.
    pub fn service(&self, interface: &str, version: u32) -> Option<&Manifest> {
        self.manifests()
            .find(|m| m.interface == interface && m.version == version)
    }

    /// A record or enum by its fully qualified name (`common.Money`).
    pub fn type_def(&self, qualified: &str) -> Option<&TypeDef> {
        let (package, _) = qualified.rsplit_once('.')?;
        self.package(package)?
            .types
            .iter()
            .find(|(name, _)| name == qualified)
            .map(|(_, def)| def)
    }
}
