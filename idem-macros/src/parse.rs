//! Syntax of the attribute's arguments: `name = value` pairs and `name(...)`
//! lists. Meaning is assigned later, in `validate`, so that every semantic
//! problem can be reported at once; only malformed syntax stops here.

use proc_macro2::Span;
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::spanned::Spanned;
use syn::{token, Expr, ExprLit, Ident, Lit, Token};

/// One argument as written.
pub(crate) struct Arg {
    pub(crate) name: Ident,
    pub(crate) value: Value,
}

/// What follows an argument's name.
pub(crate) enum Value {
    /// Nothing: `#[tool(jitter)]`.
    Bare,
    /// `name = expr`.
    Expr(Expr),
    /// `name(a = 1, b = 2)`.
    List(Span, Vec<Arg>),
}

/// The whole argument list of `#[tool(...)]`.
pub(crate) struct Args(pub(crate) Vec<Arg>);

impl Parse for Args {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        parse_list(input).map(Args)
    }
}

fn parse_list(input: ParseStream) -> syn::Result<Vec<Arg>> {
    let mut args = Vec::new();
    while !input.is_empty() {
        // `crate` is a keyword; accept it (and any other) as a name so the
        // unknown-argument check can explain what went wrong.
        let name = input.call(Ident::parse_any)?;
        let value = if input.peek(Token![=]) {
            input.parse::<Token![=]>()?;
            Value::Expr(input.parse()?)
        } else if input.peek(token::Paren) {
            let content;
            let paren = syn::parenthesized!(content in input);
            Value::List(paren.span.join(), parse_list(&content)?)
        } else {
            Value::Bare
        };
        args.push(Arg { name, value });
        if input.is_empty() {
            break;
        }
        input.parse::<Token![,]>()?;
    }
    Ok(args)
}

impl Value {
    /// The tokens to blame for a bad value (the name itself when there is
    /// no value).
    pub(crate) fn span(&self, name: &Ident) -> Span {
        match self {
            Value::Bare => name.span(),
            Value::Expr(e) => e.span(),
            Value::List(span, _) => *span,
        }
    }

    /// The string literal, if the value is one.
    pub(crate) fn as_str(&self) -> Option<syn::LitStr> {
        match self {
            Value::Expr(Expr::Lit(ExprLit {
                lit: Lit::Str(s), ..
            })) => Some(s.clone()),
            _ => None,
        }
    }
}
