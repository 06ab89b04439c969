//! Compiling a register program to single-precision steps, where every value is float32
//! and every function exact in f32; constants fold.

use super::{binary_fn, unary_fn, Arg, Fast32, Step};
use crate::array::DType;
use crate::kernels::eval::inst::Inst;
use crate::kernels::work::wrap_int;
use crate::plan::expr::Func;
use crate::plan::Scalar;

/// Whether `func` is one of the unary functions exact in f32.
fn is_unary(func: Func) -> bool {
    matches!(
        func,
        Func::Negative | Func::Abs | Func::Sqrt | Func::Floor | Func::Ceil
    )
}

/// Whether `func` is one of the binary functions exact in f32.
fn is_binary(func: Func) -> bool {
    matches!(
        func,
        Func::Add | Func::Subtract | Func::Multiply | Func::Divide | Func::Maximum | Func::Minimum
    )
}

/// The float32 value of a constant that the general evaluator would give after loading it as
/// `dtype` and casting it to float32; `None` for constants this path does not take.
fn const_as_f32(value: Scalar, dtype: DType) -> Option<f32> {
    let v = match (value, dtype) {
        (Scalar::Float(f), DType::F32 | DType::F64) => f,
        (Scalar::Int(i), DType::F32 | DType::F64) => i as f64,
        (
            Scalar::Int(i),
            DType::I8 | DType::I16 | DType::I32 | DType::I64 | DType::U8 | DType::U16 | DType::U32,
        ) => wrap_int(i as i64, dtype) as f64,
        _ => return None,
    };
    Some(v as f32)
}

impl Fast32 {
    /// Compiles `insts` when every value is float32 and every function exact in f32.
    pub fn compile(insts: &[Inst]) -> Option<Fast32> {
        let mut steps = Vec::new();
        let mut vals: Vec<Arg> = Vec::with_capacity(insts.len());
        let push = |steps: &mut Vec<Step>, s: Step| {
            steps.push(s);
            Arg::Step(steps.len() - 1)
        };
        for inst in insts {
            let v = match inst {
                Inst::Load {
                    leaf,
                    dtype: DType::F32,
                } => push(&mut steps, Step::Load { leaf: *leaf }),
                // A complex64 leaf is only usable through `abs` (calls below check their
                // arguments are float32, casts that they cast float32 or constants).
                Inst::Load {
                    dtype: DType::C64, ..
                } => Arg::Scalar(f32::NAN),
                Inst::Call {
                    func: Func::Abs,
                    sig,
                    args,
                } if sig.compute == DType::C64 && sig.result == DType::F32 => match args[..] {
                    [a] => match insts.get(a)? {
                        Inst::Load {
                            leaf,
                            dtype: DType::C64,
                        } => push(&mut steps, Step::LoadAbs { leaf: *leaf }),
                        _ => return None,
                    },
                    _ => return None,
                },
                // A constant of another dtype is only usable through a cast to float32 (calls
                // below take float32 arguments only), which gives this value.
                Inst::Const { value, dtype } => Arg::Scalar(const_as_f32(*value, *dtype)?),
                Inst::Cast {
                    arg,
                    to: DType::F32,
                } => match (insts.get(*arg)?, *vals.get(*arg)?) {
                    (from, v) if from.dtype() == DType::F32 => v,
                    (Inst::Const { .. }, v) => v,
                    _ => return None,
                },
                Inst::Call { func, sig, args }
                    if sig.compute == DType::F32
                        && sig.result == DType::F32
                        && args
                            .iter()
                            .all(|a| insts.get(*a).map(Inst::dtype) == Some(DType::F32)) =>
                {
                    match (args.as_slice(), is_unary(*func), is_binary(*func)) {
                        // x ** 2 is x * x, exactly (numpy squares too).
                        ([a, b], _, _)
                            if *func == Func::Power
                                && *vals.get(*b)? == Arg::Scalar(2.0)
                                && matches!(vals.get(*a)?, Arg::Step(_)) =>
                        {
                            let x = *vals.get(*a)?;
                            push(
                                &mut steps,
                                Step::Binary {
                                    func: Func::Multiply,
                                    a: x,
                                    b: x,
                                },
                            )
                        }
                        ([a], true, _) => match *vals.get(*a)? {
                            Arg::Scalar(x) => Arg::Scalar(unary_fn(*func, x)),
                            Arg::Step(a) => push(&mut steps, Step::Unary { func: *func, a }),
                        },
                        ([a, b], _, true) => match (*vals.get(*a)?, *vals.get(*b)?) {
                            (Arg::Scalar(x), Arg::Scalar(y)) => Arg::Scalar(binary_fn(*func, x, y)),
                            (a, b) => push(&mut steps, Step::Binary { func: *func, a, b }),
                        },
                        _ => return None,
                    }
                }
                _ => return None,
            };
            vals.push(v);
        }
        if insts.last()?.dtype() != DType::F32 {
            return None;
        }
        let result = *vals.last()?;
        Some(Fast32 { steps, result })
    }
}
