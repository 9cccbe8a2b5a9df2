//! Tables: one `SlotMap` per kind of row, plus optional columns in
//! `SecondaryMap`s. Tables hold data and their own invariants; the systems in
//! [`crate::systems`] hold the behaviour.

mod kv_blocks;
mod mm_items;
mod requests;

pub use kv_blocks::{BlockContent, KvBlock, KvBlocks, LruLinks, SiblingLink, Siblings};
pub use mm_items::{MmItem, MmItems, TokenRun};
pub use requests::{Request, RequestScope, Requests, WindowTable};
