//! The float32 path against the general evaluator, bit for bit.

use super::*;
use crate::array::{Buffer, DType};
use crate::kernels::eval::inst::Inst;
use crate::kernels::eval::program::Program;
use crate::kernels::work::{Reg, Strided};
use crate::plan::expr::Signature;
use crate::plan::Scalar;
use proptest::prelude::*;

const F32: Signature = Signature {
    compute: DType::F32,
    result: DType::F32,
};

fn call(func: Func, args: Vec<usize>) -> Inst {
    Inst::Call {
        func,
        sig: F32,
        args,
    }
}

fn load(leaf: usize) -> Inst {
    Inst::Load {
        leaf,
        dtype: DType::F32,
    }
}

/// Every function of this path over two leaves and a constant, both orders of operands.
fn programs() -> Vec<Program> {
    let c = Inst::Const {
        value: Scalar::Float(1.5),
        dtype: DType::F32,
    };
    let mut out = Vec::new();
    for func in [
        Func::Add,
        Func::Subtract,
        Func::Multiply,
        Func::Divide,
        Func::Maximum,
        Func::Minimum,
    ] {
        out.push(Program {
            insts: vec![load(0), load(1), call(func, vec![0, 1])],
        });
        out.push(Program {
            insts: vec![load(0), c.clone(), call(func, vec![1, 0])],
        });
        out.push(Program {
            insts: vec![load(0), c.clone(), call(func, vec![0, 1])],
        });
    }
    out.push(Program {
        insts: vec![
            load(0),
            Inst::Const {
                value: Scalar::Int(2),
                dtype: DType::F32,
            },
            call(Func::Power, vec![0, 1]),
        ],
    });
    for func in [
        Func::Negative,
        Func::Abs,
        Func::Sqrt,
        Func::Floor,
        Func::Ceil,
    ] {
        out.push(Program {
            insts: vec![
                load(0),
                load(1),
                call(func, vec![0]),
                call(Func::Multiply, vec![2, 1]),
            ],
        });
        // A function as the last step goes straight to the sink: of a contiguous leaf
        // and of a strided one.
        out.push(Program {
            insts: vec![load(0), call(func, vec![0])],
        });
        out.push(Program {
            insts: vec![load(1), call(func, vec![0])],
        });
    }
    // A chain of steps with constants, as `(x + 1) * 2`, and a plain load.
    out.push(Program {
        insts: vec![
            load(0),
            c.clone(),
            call(Func::Add, vec![0, 1]),
            c.clone(),
            call(Func::Multiply, vec![2, 3]),
        ],
    });
    out.push(Program {
        insts: vec![load(1)],
    });
    out
}

fn buf(v: &[f32]) -> Buffer {
    let mut b = Buffer::zeros(DType::F32, v.len());
    if let Ok(s) = b.as_slice_mut::<f32>() {
        s.copy_from_slice(v);
    }
    b
}

fn general(prog: &Program, leaves: &[(&Buffer, Strided)], n: usize) -> Vec<f64> {
    let mut regs: Vec<Reg> = prog
        .insts
        .iter()
        .map(|i| {
            let mut r = Reg::for_dtype(i.dtype());
            if let Inst::Const { value, dtype } = i {
                crate::kernels::work::fill_const(&mut r, *value, *dtype);
            }
            r
        })
        .collect();
    let r = prog.eval_general(&mut regs, leaves, n).unwrap();
    match &regs[r] {
        Reg::F(v) => v[..n].to_vec(),
        other => panic!("not a float register: {other:?}"),
    }
}

fn same(a: f64, b: f64) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

proptest! {
    /// Bit for bit what the general f64 evaluator gives, contiguous, broadcast and
    /// strided leaves alike.
    #[test]
    fn matches_the_general_evaluator(
        a in proptest::collection::vec(prop_oneof![
            -1e30f32..1e30f32, Just(f32::NAN), Just(0.0f32), Just(-0.0f32),
            Just(f32::INFINITY), Just(3.4e38f32), 1e-40f32..1e-37f32], 1..=TILE),
        b in proptest::collection::vec(-1e6f32..1e6f32, 2 * TILE),
        stride in 0usize..3,
    ) {
        let n = a.len();
        let ab = buf(&a);
        let bb = buf(&b);
        let leaves = [
            (&ab, Strided { offset: 0, stride: 1 }),
            (&bb, Strided { offset: 0, stride }),
        ];
        for prog in programs() {
            let fast = Fast32::compile(&prog.insts).expect("compiles");
            let mut scratch = fast.scratch();
            let mut out = vec![0.0f64; TILE];
            fast.eval(&mut scratch, &leaves, n, &mut out).unwrap();
            let want = general(&prog, &leaves, n);
            for i in 0..n {
                prop_assert!(same(out[i], want[i]), "{prog:?} at {i}: {} vs {}", out[i], want[i]);
            }
            // Added straight into running sums: the same additions a fold makes.
            let mut sums: Vec<f64> = (0..TILE).map(|i| i as f64 * 0.37 - 20.0).collect();
            fast.eval_add(&mut scratch, &leaves, n, &mut sums).unwrap();
            for i in 0..n {
                let expected = (i as f64 * 0.37 - 20.0) + want[i];
                prop_assert!(same(sums[i], expected), "{prog:?} sum at {i}: {} vs {expected}", sums[i]);
            }
            // Added into float32 running sums: one f32 addition of the exact value.
            let mut sums32: Vec<f32> = (0..TILE).map(|i| i as f32 * 0.37 - 20.0).collect();
            fast.eval_add_f32(&mut scratch, &leaves, n, &mut sums32, SumMode::Add).unwrap();
            for i in 0..n {
                let expected = ((i as f32 * 0.37 - 20.0) as f64 + want[i]) as f32;
                prop_assert!(same(sums32[i] as f64, expected as f64), "{prog:?} f32 sum at {i}: {} vs {expected}", sums32[i]);
            }
            // Started: the values themselves, whatever the sums held; nothing past `n`.
            let mut started: Vec<f32> = vec![7.5; TILE];
            fast.eval_add_f32(&mut scratch, &leaves, n, &mut started, SumMode::Start).unwrap();
            for i in 0..n {
                prop_assert!(same(started[i] as f64, want[i]), "{prog:?} started sum at {i}: {} vs {}", started[i], want[i]);
            }
            prop_assert!(started[n..].iter().all(|x| *x == 7.5));
            // NaN-skipping float32 sums, counted (nanmean) and not (nansum).
            let base = |i: usize| i as f32 * 0.37 - 20.0;
            let mut nan_sums: Vec<f32> = (0..TILE).map(base).collect();
            let mut plain_sums = nan_sums.clone();
            let mut counts: Vec<u8> = (0..TILE).map(|i| (i % 7) as u8).collect();
            fast.eval_add_f32_skip_nan(&mut scratch, &leaves, n, &mut nan_sums, Some(&mut counts), SumMode::Add).unwrap();
            fast.eval_add_f32_skip_nan(&mut scratch, &leaves, n, &mut plain_sums, None, SumMode::Add).unwrap();
            for i in 0..n {
                let (expected, count) = match want[i].is_nan() {
                    true => (base(i), (i % 7) as u8),
                    false => (((base(i) as f64) + want[i]) as f32, (i % 7) as u8 + 1),
                };
                prop_assert!(same(nan_sums[i] as f64, expected as f64), "{prog:?} nan sum at {i}: {} vs {expected}", nan_sums[i]);
                prop_assert!(same(plain_sums[i] as f64, expected as f64), "{prog:?} uncounted nan sum at {i}");
                prop_assert_eq!(counts[i], count, "{:?} count at {}", prog, i);
            }
            // Started, skipping NaNs: the value or 0, counted 1 or 0, whatever was there.
            let mut nan_started = vec![7.5f32; TILE];
            let mut plain_started = nan_started.clone();
            let mut started_counts = vec![9u8; TILE];
            fast.eval_add_f32_skip_nan(&mut scratch, &leaves, n, &mut nan_started, Some(&mut started_counts), SumMode::Start).unwrap();
            fast.eval_add_f32_skip_nan(&mut scratch, &leaves, n, &mut plain_started, None, SumMode::Start).unwrap();
            for i in 0..n {
                let (expected, count) = match want[i].is_nan() {
                    true => (0.0, 0),
                    false => (want[i] as f32, 1),
                };
                prop_assert!(same(nan_started[i] as f64, expected as f64), "{prog:?} started nan sum at {i}: {} vs {expected}", nan_started[i]);
                prop_assert!(same(plain_started[i] as f64, expected as f64), "{prog:?} started uncounted nan sum at {i}");
                prop_assert_eq!(started_counts[i], count, "{:?} started count at {}", prog, i);
            }
            prop_assert!(nan_started[n..].iter().chain(&plain_started[n..]).all(|x| *x == 7.5));
            prop_assert!(started_counts[n..].iter().all(|c| *c == 9));
        }
    }
}

fn complex_load(leaf: usize) -> Inst {
    Inst::Load {
        leaf,
        dtype: DType::C64,
    }
}

fn complex_abs(arg: usize) -> Inst {
    Inst::Call {
        func: Func::Abs,
        sig: Signature {
            compute: DType::C64,
            result: DType::F32,
        },
        args: vec![arg],
    }
}

proptest! {
    /// `abs` of complex64 leaves (a power spectrum is `abs(z) * abs(z)`), bit for bit what
    /// the general evaluator gives.
    #[test]
    fn complex_moduli_match_the_general_evaluator(
        z in proptest::collection::vec(prop_oneof![
            -1e30f32..1e30f32, Just(f32::NAN), Just(0.0f32), Just(-0.0f32),
            Just(f32::INFINITY), Just(3.4e38f32), 1e-40f32..1e-37f32], 2..=2 * TILE),
        stride in 0usize..3,
    ) {
        let n = z.len() / 2;
        let mut zb = Buffer::zeros(DType::C64, n);
        zb.as_slice_mut::<[f32; 2]>().unwrap().iter_mut().enumerate().for_each(|(i, v)| {
            *v = [z[2 * i], z[2 * i + 1]];
        });
        let count = if stride == 0 { 1 } else { n.div_ceil(stride) };
        let leaves = [(&zb, Strided { offset: 0, stride })];
        let squared = Program {
            insts: vec![complex_load(0), complex_abs(0), call(Func::Multiply, vec![1, 1])],
        };
        let plus = Program {
            insts: vec![
                complex_load(0),
                complex_abs(0),
                Inst::Const { value: Scalar::Float(0.25), dtype: DType::F32 },
                call(Func::Add, vec![1, 2]),
            ],
        };
        for prog in [squared, plus] {
            let fast = Fast32::compile(&prog.insts).expect("compiles");
            let mut scratch = fast.scratch();
            let mut out = vec![0.0f64; TILE];
            fast.eval(&mut scratch, &leaves, count, &mut out).unwrap();
            let want = general(&prog, &leaves, count);
            for i in 0..count {
                prop_assert!(same(out[i], want[i]), "{prog:?} at {i}: {} vs {}", out[i], want[i]);
            }
        }
    }
}

#[test]
fn complex_leaves_are_only_read_through_abs() {
    // The complex value itself, its cast to float32 or arithmetic on it: general path.
    for insts in [
        vec![complex_load(0)],
        vec![
            complex_load(0),
            Inst::Cast {
                arg: 0,
                to: DType::F32,
            },
        ],
        vec![
            complex_load(0),
            Inst::Call {
                func: Func::Multiply,
                sig: Signature {
                    compute: DType::C64,
                    result: DType::C64,
                },
                args: vec![0, 0],
            },
            complex_abs(1),
        ],
    ] {
        assert!(Fast32::compile(&insts).is_none(), "{insts:?}");
    }
}

#[test]
fn casts_of_constants_fold_and_other_programs_stay_general() {
    let prog = Program {
        insts: vec![
            load(0),
            Inst::Const {
                value: Scalar::Float(0.1),
                dtype: DType::F64,
            },
            Inst::Cast {
                arg: 1,
                to: DType::F32,
            },
            call(Func::Add, vec![0, 2]),
        ],
    };
    let fast = Fast32::compile(&prog.insts).expect("compiles");
    assert_eq!(
        fast.steps[1],
        Step::Binary {
            func: Func::Add,
            a: Arg::Step(0),
            b: Arg::Scalar(0.1f64 as f32)
        }
    );
    let exp = Program {
        insts: vec![load(0), call(Func::Exp, vec![0])],
    };
    assert!(Fast32::compile(&exp.insts).is_none());
    let f64_load = Program {
        insts: vec![Inst::Load {
            leaf: 0,
            dtype: DType::F64,
        }],
    };
    assert!(Fast32::compile(&f64_load.insts).is_none());
}
