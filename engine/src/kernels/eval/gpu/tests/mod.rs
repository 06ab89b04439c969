//! The GPU against the CPU evaluator: random fused programs over every real dtype, with
//! edge values (NaN, infinities, signed zeros, integer extremes) and leaves laid out as the
//! output, broadcast, and as windows of larger buffers. Needs a CUDA device; without one the
//! test says so and passes, unless `CHUNKFUSE_REQUIRE_GPU=1` (set it on a GPU machine so a
//! missing device fails). The same programs are compiled for the host by a C compiler and
//! checked on every machine ([`host`]).

mod host;

use super::gpu;
use crate::array::dtype::{Operand, ALL_DTYPES};
use crate::array::grid::c_strides;
use crate::array::{Buffer, DType};
use crate::kernels::eval::inst::Inst;
use crate::kernels::eval::program::Program;
use crate::kernels::eval::tiles::{eval_into, LeafInput};
use crate::plan::expr::resolve;
use crate::plan::{Func, Scalar};

/// xorshift64*: a small deterministic generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

/// Every real dtype (the GPU takes no complex values).
fn real_dtypes() -> Vec<DType> {
    ALL_DTYPES
        .into_iter()
        .filter(|d| d.kind() != crate::array::dtype::Kind::Complex)
        .collect()
}

/// Functions whose float results may differ from the CPU's in the last units.
fn inexact(f: Func) -> bool {
    matches!(
        f,
        Func::Exp | Func::Log | Func::Sin | Func::Cos | Func::Power
    )
}

/// Functions with no GPU form (a program using one runs on the CPU): not drawn, so most
/// random programs run on the GPU.
fn cpu_only(f: Func) -> bool {
    f.is_float_math()
        || matches!(
            f,
            Func::Square
                | Func::Sign
                | Func::Trunc
                | Func::IsNan
                | Func::IsInf
                | Func::IsFinite
                | Func::Arctan2
                | Func::Hypot
                | Func::Fmax
                | Func::Fmin
                | Func::Rint
        )
}

struct Builder<'a> {
    prog: Program,
    leaves: &'a [DType],
    rng: &'a mut Rng,
}

impl Builder<'_> {
    fn push(&mut self, inst: Inst) -> usize {
        self.prog.insts.push(inst);
        self.prog.insts.len() - 1
    }

    fn cast(&mut self, r: usize, to: DType) -> usize {
        if self.prog.insts[r].dtype() == to {
            r
        } else {
            self.push(Inst::Cast { arg: r, to })
        }
    }

    fn terminal(&mut self) -> usize {
        if self.rng.chance(70) {
            let leaf = self.rng.below(self.leaves.len());
            return self.push(Inst::Load {
                leaf,
                dtype: self.leaves[leaf],
            });
        }
        let dtypes = real_dtypes();
        let dtype = dtypes[self.rng.below(dtypes.len())];
        let value = match dtype.kind() {
            crate::array::dtype::Kind::Bool => Scalar::Bool(self.rng.chance(50)),
            crate::array::dtype::Kind::Float => {
                Scalar::Float([0.5, -2.0, 3.25, 1e-3, 7.0][self.rng.below(5)])
            }
            _ => Scalar::Int([0i128, 1, 2, -3, 100, 300][self.rng.below(6)]),
        };
        self.push(Inst::Const { value, dtype })
    }

    fn expr(&mut self, depth: usize) -> usize {
        if depth == 0 || self.rng.chance(25) {
            return self.terminal();
        }
        let funcs: Vec<Func> = Func::ALL
            .iter()
            .map(|(_, f)| *f)
            .filter(|f| !cpu_only(*f))
            .collect();
        let func = funcs[self.rng.below(funcs.len())];
        let args: Vec<usize> = (0..func.arity()).map(|_| self.expr(depth - 1)).collect();
        let typed: Vec<Operand> = args
            .iter()
            .map(|&a| Operand::Strong(self.prog.insts[a].dtype()))
            .collect();
        let Ok(sig) = resolve(func, &typed) else {
            return args[0];
        };
        let args = args
            .iter()
            .enumerate()
            .map(|(i, &a)| {
                let to = if func == Func::Where && i == 0 {
                    DType::Bool
                } else {
                    sig.compute
                };
                self.cast(a, to)
            })
            .collect();
        self.push(Inst::Call { func, sig, args })
    }
}

/// Random values of `dtype`, edge values among them.
fn values(dtype: DType, n: usize, rng: &mut Rng) -> Buffer {
    let mut b = Buffer::zeros(dtype, n);
    macro_rules! fill {
        ($t:ty, $edges:expr, $gen:expr) => {{
            let edges: Vec<$t> = $edges;
            let s = b.as_slice_mut::<$t>().expect("dtype");
            for v in s.iter_mut() {
                *v = if rng.chance(20) {
                    edges[rng.below(edges.len())]
                } else {
                    $gen(rng.next())
                };
            }
        }};
    }
    match dtype {
        DType::Bool => fill!(u8, vec![0, 1], |x: u64| (x & 1) as u8),
        DType::I8 => fill!(i8, vec![i8::MIN, i8::MAX, 0, -1], |x: u64| x as i8),
        DType::I16 => fill!(i16, vec![i16::MIN, i16::MAX, 0, -1], |x: u64| x as i16
            % 1000),
        DType::I32 => fill!(i32, vec![i32::MIN, i32::MAX, 0, -1], |x: u64| x as i32
            % 1000),
        DType::I64 => fill!(i64, vec![i64::MIN, i64::MAX, 0, -1], |x: u64| x as i64
            % 1000),
        DType::U8 => fill!(u8, vec![0, u8::MAX], |x: u64| x as u8),
        DType::U16 => fill!(u16, vec![0, u16::MAX], |x: u64| x as u16 % 1000),
        DType::U32 => fill!(u32, vec![0, u32::MAX], |x: u64| x as u32 % 1000),
        DType::U64 => fill!(u64, vec![0, u64::MAX, 1 << 63], |x: u64| x % 1000),
        DType::F32 => fill!(
            f32,
            vec![
                f32::NAN,
                f32::INFINITY,
                -f32::INFINITY,
                0.0,
                -0.0,
                1e30,
                -1e-30
            ],
            |x: u64| ((x % 20_000) as f32 - 10_000.0) / 97.0
        ),
        DType::F64 => fill!(
            f64,
            vec![
                f64::NAN,
                f64::INFINITY,
                -f64::INFINITY,
                0.0,
                -0.0,
                1e300,
                3e19
            ],
            |x: u64| ((x % 20_000) as f64 - 10_000.0) / 97.0
        ),
        DType::C64 | DType::C128 => {}
    }
    b
}

/// The leaves of a region of `shape`: leaf 0 laid out as the output, leaf 1 broadcast along
/// axis 1 from an offset, leaf 2 a window of a larger buffer.
fn layouts(shape: &[u64], dtypes: &[DType], rng: &mut Rng) -> Vec<(Buffer, usize, Vec<usize>)> {
    let n: u64 = shape.iter().product();
    let strides: Vec<usize> = c_strides(shape).iter().map(|&s| s as usize).collect();
    dtypes
        .iter()
        .enumerate()
        .map(|(i, &d)| match i % 3 {
            0 => (values(d, n as usize, rng), 0, strides.clone()),
            1 => {
                let mut st = strides.clone();
                st[1] = 0;
                let span = 3 + shape
                    .iter()
                    .zip(&st)
                    .map(|(&s, &t)| (s as usize - 1) * t)
                    .sum::<usize>();
                (values(d, span + 1, rng), 3, st)
            }
            _ => {
                let big: Vec<u64> = shape.iter().map(|s| s + 2).collect();
                let st: Vec<usize> = c_strides(&big).iter().map(|&s| s as usize).collect();
                let offset = st.iter().sum::<usize>();
                let len = big.iter().product::<u64>() as usize;
                (values(d, len, rng), offset, st)
            }
        })
        .collect()
}

fn same(dtype: DType, a: &Buffer, b: &Buffer, tolerant: bool) -> Result<(), String> {
    fn close(x: f64, y: f64, tol: f64, tolerant: bool) -> bool {
        if x == y || (x.is_nan() && y.is_nan()) {
            return true;
        }
        tolerant && x.is_finite() && y.is_finite() && (x - y).abs() <= tol * x.abs().max(y.abs())
    }
    match dtype {
        DType::F32 => {
            let (x, y) = (a.as_slice::<f32>().unwrap(), b.as_slice::<f32>().unwrap());
            for (i, (p, q)) in x.iter().zip(y).enumerate() {
                if !close(*p as f64, *q as f64, 4e-7, tolerant) {
                    return Err(format!("value {i}: cpu {p:e}, gpu {q:e}"));
                }
            }
        }
        DType::F64 => {
            let (x, y) = (a.as_slice::<f64>().unwrap(), b.as_slice::<f64>().unwrap());
            for (i, (p, q)) in x.iter().zip(y).enumerate() {
                if !close(*p, *q, 1e-14, tolerant) {
                    return Err(format!("value {i}: cpu {p:e}, gpu {q:e}"));
                }
            }
        }
        _ => {
            if a.bytes() != b.bytes() {
                let item = dtype.size();
                let i = a
                    .bytes()
                    .chunks(item)
                    .zip(b.bytes().chunks(item))
                    .position(|(p, q)| p != q)
                    .unwrap_or(0);
                return Err(format!("value {i} differs ({dtype})"));
            }
        }
    }
    Ok(())
}

/// One random program with its leaves' dtypes, region and values.
struct Case {
    prog: Program,
    leaf_dtypes: Vec<DType>,
    shape: Vec<u64>,
    leaves: Vec<(Buffer, usize, Vec<usize>)>,
}

impl Case {
    fn inputs(&self) -> Vec<LeafInput<'_>> {
        self.leaves
            .iter()
            .map(|(buf, offset, strides)| LeafInput {
                buf,
                offset: *offset,
                strides: strides.clone(),
            })
            .collect()
    }

    fn len(&self) -> usize {
        self.shape.iter().product::<u64>() as usize
    }

    /// The CPU evaluator's values; `None` for programs it refuses (integers to negative
    /// powers), which have no reference.
    fn reference(&self) -> Option<Buffer> {
        let mut cpu = Buffer::zeros(self.prog.dtype(), self.len());
        eval_into(&self.prog, &self.inputs(), &self.shape, &mut cpu).ok()?;
        Some(cpu)
    }

    /// Whether the program calls a function whose float results may differ in the last
    /// units.
    fn tolerant(&self) -> bool {
        self.prog
            .insts
            .iter()
            .any(|i| matches!(i, Inst::Call { func, .. } if inexact(*func)))
    }

    /// `out` against the CPU evaluator's `cpu`, or what differs.
    fn check(&self, k: usize, cpu: &Buffer, out: &Buffer) -> Result<(), String> {
        same(self.prog.dtype(), cpu, out, self.tolerant()).map_err(|e| {
            format!(
                "case {k}: {e}\nleaves {:?}\nprogram {:#?}",
                self.leaf_dtypes, self.prog
            )
        })
    }
}

/// `count` random programs over one to three leaves of random dtypes, on regions of two
/// shapes; the same ones every time.
fn cases(count: usize) -> Vec<Case> {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let dtypes = real_dtypes();
    (0..count)
        .map(|k| {
            let leaf_dtypes: Vec<DType> = (0..1 + rng.below(3))
                .map(|_| dtypes[rng.below(dtypes.len())])
                .collect();
            let mut b = Builder {
                prog: Program::default(),
                leaves: &leaf_dtypes,
                rng: &mut rng,
            };
            b.expr(4);
            let prog = b.prog;
            let shape: Vec<u64> = if k % 4 == 0 {
                vec![5, 130, 67]
            } else {
                vec![3, 4, 5]
            };
            let leaves = layouts(&shape, &leaf_dtypes, &mut rng);
            Case {
                prog,
                leaf_dtypes,
                shape,
                leaves,
            }
        })
        .collect()
}

#[test]
fn random_programs_match_the_cpu_evaluator() {
    let gpu = match gpu() {
        Ok(g) => g,
        Err(e) if std::env::var_os("CHUNKFUSE_REQUIRE_GPU").is_none() => {
            eprintln!("skipped: {e}");
            return;
        }
        Err(e) => panic!("CHUNKFUSE_REQUIRE_GPU is set: {e}"),
    };
    let (mut ran, mut cpu_only) = (0, 0);
    for (k, case) in cases(400).iter().enumerate() {
        let Some(cpu) = case.reference() else {
            continue;
        };
        let Some(kernel) = gpu
            .compile(&case.prog, &case.leaf_dtypes, case.shape.len())
            .unwrap()
        else {
            cpu_only += 1;
            continue;
        };
        let mut out = Buffer::zeros(case.prog.dtype(), case.len());
        kernel
            .eval_into(&case.inputs(), &case.shape, &mut out)
            .unwrap();
        if let Err(e) = case.check(k, &cpu, &out) {
            panic!("{e}");
        }
        ran += 1;
    }
    eprintln!(
        "{ran} programs matched on {}, {cpu_only} CPU-only",
        gpu.describe()
    );
    assert!(ran > 200, "only {ran} programs ran on the GPU");
}
