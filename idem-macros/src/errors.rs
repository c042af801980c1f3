//! Errors collected instead of stopped at: one `compile_error!` each,
//! spanned on the token at fault, reported together.

use proc_macro2::Span;
use quote::ToTokens;

/// Collects errors instead of stopping at the first.
#[derive(Default)]
pub(crate) struct Errors(Option<syn::Error>);

impl Errors {
    pub(crate) fn push(&mut self, e: syn::Error) {
        match &mut self.0 {
            Some(all) => all.combine(e),
            None => self.0 = Some(e),
        }
    }

    pub(crate) fn at(&mut self, span: Span, msg: impl std::fmt::Display) {
        self.push(syn::Error::new(span, msg));
    }

    pub(crate) fn on(&mut self, tokens: impl ToTokens, msg: impl std::fmt::Display) {
        self.push(syn::Error::new_spanned(tokens, msg));
    }

    /// The collected errors; at least one must have been pushed.
    pub(crate) fn into_error(self) -> syn::Error {
        self.0
            .unwrap_or_else(|| syn::Error::new(Span::call_site(), "invalid #[tool]"))
    }

    pub(crate) fn finish<T>(self, value: T) -> syn::Result<T> {
        match self.0 {
            Some(e) => Err(e),
            None => Ok(value),
        }
    }
}
