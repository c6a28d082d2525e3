//! A 4096-byte payload copy at the placements of destination against source that
//! `copy_bytes` exists for: 8 bytes past it modulo the page (the slow case of `rep
//! movsb` on some CPUs), and 512 past it (an ordinary one), each by `copy_bytes` and
//! by `copy_from_slice`. `copy_bytes` should take about the same time at both, and
//! `copy_from_slice` at 512.
//!
//! `cargo bench -p verbs-api --bench copy`.
#![allow(missing_docs)] // criterion_group! generates an undocumented function

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use verbs_api::copy_bytes;

const LEN: usize = 4096;

fn copies(c: &mut Criterion) {
    let src = vec![7u8; 2 * 4096 + LEN];
    let mut dst = vec![0u8; 3 * 4096 + LEN];
    let from = src.as_ptr() as usize + 4096;
    let mut g = c.benchmark_group("copy_4096");
    g.throughput(Throughput::Bytes(LEN as u64));
    for gap in [8usize, 512] {
        let to = (from + gap).wrapping_sub(dst.as_ptr() as usize) % 4096 + 4096;
        let s = &src[4096..4096 + LEN];
        g.bench_function(format!("copy_bytes_gap_{gap}"), |b| {
            b.iter(|| copy_bytes(black_box(&mut dst[to..to + LEN]), black_box(s)));
        });
        g.bench_function(format!("copy_from_slice_gap_{gap}"), |b| {
            b.iter(|| black_box(&mut dst[to..to + LEN]).copy_from_slice(black_box(s)));
        });
    }
    g.finish();
}

criterion_group!(benches, copies);
criterion_main!(benches);
