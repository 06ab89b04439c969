//! An accumulator as bytes and back: the partial state a batch of a reduction's groups
//! writes to shared storage, for another process to merge (see `exec::ops::reduce`).
//!
//! Layout (little-endian): the magic `CFACC1`, the function's name (u8 length, then the
//! bytes), the state's tag (u8), then each of the state's vectors as a u64 element count
//! followed by its elements. A buffer adds its dtype's name before its elements.

use num_complex::Complex64;

use super::{Accumulator, State};
use crate::array::{Buffer, DType};
use crate::error::{Error, ErrorKind, Result};
use crate::kernels::work::Reg;
use crate::plan::ReduceFunc;

const MAGIC: &[u8; 6] = b"CFACC1";

/// Writes the pieces of a state.
struct Writer(Vec<u8>);

impl Writer {
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn name(&mut self, name: &str) {
        self.0.push(name.len() as u8);
        self.0.extend_from_slice(name.as_bytes());
    }
    /// Eight-byte values, little-endian (copied whole on a little-endian machine).
    fn words<T: bytemuck::Pod>(&mut self, v: &[T], le: impl Fn(&T) -> [u8; 8]) {
        self.u64(v.len() as u64);
        if cfg!(target_endian = "little") {
            self.0.extend_from_slice(bytemuck::cast_slice(v));
        } else {
            self.0.reserve(v.len() * 8);
            for x in v {
                self.0.extend_from_slice(&le(x));
            }
        }
    }
    fn f64s(&mut self, v: &[f64]) {
        self.words(v, |x| x.to_le_bytes())
    }
    fn i64s(&mut self, v: &[i64]) {
        self.words(v, |x| x.to_le_bytes())
    }
    fn u64s(&mut self, v: &[u64]) {
        self.words(v, |x| x.to_le_bytes())
    }
    fn bools(&mut self, v: &[bool]) {
        self.u64(v.len() as u64);
        self.0.extend(v.iter().map(|&b| u8::from(b)));
    }
    fn complex(&mut self, v: &[Complex64]) {
        self.u64(v.len() as u64);
        self.0.extend(
            v.iter()
                .flat_map(|c| [c.re.to_le_bytes(), c.im.to_le_bytes()])
                .flatten(),
        );
    }
    fn buffer(&mut self, b: &Buffer) {
        self.name(b.dtype().name());
        self.u64(b.len() as u64);
        self.0.extend_from_slice(b.bytes());
    }
    fn reg(&mut self, r: &Reg) {
        match r {
            Reg::B(v) => {
                self.0.push(0);
                self.bools(v)
            }
            Reg::I(v) => {
                self.0.push(1);
                self.i64s(v)
            }
            Reg::U(v) => {
                self.0.push(2);
                self.u64s(v)
            }
            Reg::F(v) => {
                self.0.push(3);
                self.f64s(v)
            }
            Reg::C(v) => {
                self.0.push(4);
                self.complex(v)
            }
        }
    }
}

/// Reads the pieces of a state, failing on bytes that end early or do not parse.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn bad(&self, what: &str) -> Error {
        Error::new(
            ErrorKind::Corrupt,
            format!("partial reduction state: {what} at byte {}", self.at),
        )
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let end = end.ok_or_else(|| self.bad("ends early"))?;
        let piece = &self.bytes[self.at..end];
        self.at = end;
        Ok(piece)
    }
    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn u64(&mut self) -> Result<u64> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
    fn name(&mut self) -> Result<String> {
        let n = self.u8()? as usize;
        let b = self.take(n)?;
        String::from_utf8(b.to_vec()).map_err(|_| self.bad("a name that is not UTF-8"))
    }
    /// The next element count, for elements of `size` bytes.
    fn count(&mut self, size: usize) -> Result<usize> {
        let n = self.u64()?;
        let left = (self.bytes.len() - self.at) as u64;
        if n.saturating_mul(size as u64) > left {
            return Err(self.bad("a length past the end"));
        }
        Ok(n as usize)
    }
    /// Eight-byte values, little-endian, in one pass.
    fn words<T>(&mut self, from_le: impl Fn([u8; 8]) -> T) -> Result<Vec<T>> {
        let n = self.count(8)?;
        let b = self.take(n * 8)?;
        let mut out = Vec::with_capacity(n);
        out.extend(b.chunks_exact(8).map(|c| {
            let mut a = [0u8; 8];
            a.copy_from_slice(c);
            from_le(a)
        }));
        Ok(out)
    }
    fn f64s(&mut self) -> Result<Vec<f64>> {
        self.words(f64::from_le_bytes)
    }
    fn i64s(&mut self) -> Result<Vec<i64>> {
        self.words(i64::from_le_bytes)
    }
    fn u64s(&mut self) -> Result<Vec<u64>> {
        self.words(u64::from_le_bytes)
    }
    fn bools(&mut self) -> Result<Vec<bool>> {
        let n = self.count(1)?;
        Ok(self.take(n)?.iter().map(|&b| b != 0).collect())
    }
    fn complex(&mut self) -> Result<Vec<Complex64>> {
        let n = self.count(16)?;
        let b = self.take(n * 16)?;
        Ok(b.chunks_exact(16)
            .map(|c| {
                let (mut re, mut im) = ([0u8; 8], [0u8; 8]);
                re.copy_from_slice(&c[..8]);
                im.copy_from_slice(&c[8..]);
                Complex64::new(f64::from_le_bytes(re), f64::from_le_bytes(im))
            })
            .collect())
    }
    fn buffer(&mut self) -> Result<Buffer> {
        let dtype = DType::parse(&self.name()?)?;
        let n = self.count(dtype.size())?;
        let b = self.take(n * dtype.size())?;
        Buffer::from_bytes(dtype, b.to_vec())
    }
    fn reg(&mut self) -> Result<Reg> {
        Ok(match self.u8()? {
            0 => Reg::B(self.bools()?),
            1 => Reg::I(self.i64s()?),
            2 => Reg::U(self.u64s()?),
            3 => Reg::F(self.f64s()?),
            4 => Reg::C(self.complex()?),
            _ => return Err(self.bad("an unknown value kind")),
        })
    }
}

impl Accumulator {
    /// The accumulator as bytes, for [`Accumulator::from_bytes`] in another process.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut w = Writer(MAGIC.to_vec());
        w.name(self.func.name());
        match &self.state {
            State::F(b) => {
                w.0.push(0);
                w.buffer(b)
            }
            State::C(v) => {
                w.0.push(1);
                w.complex(v)
            }
            State::I(v) => {
                w.0.push(2);
                w.i64s(v)
            }
            State::U(v) => {
                w.0.push(3);
                w.u64s(v)
            }
            State::B(v) => {
                w.0.push(4);
                w.bools(v)
            }
            State::NanMeanF(s, n) => {
                w.0.push(5);
                w.f64s(s);
                w.u64s(n)
            }
            State::NanMeanC(s, n) => {
                w.0.push(6);
                w.complex(s);
                w.u64s(n)
            }
            State::Welford(n, m, q) => {
                w.0.push(7);
                w.f64s(n);
                w.f64s(m);
                w.f64s(q)
            }
            State::WelfordC(n, m, q) => {
                w.0.push(8);
                w.f64s(n);
                w.complex(m);
                w.f64s(q)
            }
            State::Arg(best, at, seen) => {
                w.0.push(9);
                w.reg(best);
                w.i64s(at);
                w.bools(seen)
            }
        }
        w.0
    }

    /// An accumulator of `func` from [`Accumulator::to_bytes`]; bytes that do not hold one
    /// of `func` are a corrupt-data error.
    pub fn from_bytes(func: ReduceFunc, bytes: &[u8]) -> Result<Accumulator> {
        let mut r = Reader { bytes, at: 0 };
        if r.take(MAGIC.len())? != MAGIC {
            return Err(r.bad("no partial-state header"));
        }
        let name = r.name()?;
        if name != func.name() {
            return Err(r.bad(&format!("state of {name}, not {}", func.name())));
        }
        let state = match r.u8()? {
            0 => State::F(r.buffer()?),
            1 => State::C(r.complex()?),
            2 => State::I(r.i64s()?),
            3 => State::U(r.u64s()?),
            4 => State::B(r.bools()?),
            5 => State::NanMeanF(r.f64s()?, r.u64s()?),
            6 => State::NanMeanC(r.complex()?, r.u64s()?),
            7 => State::Welford(r.f64s()?, r.f64s()?, r.f64s()?),
            8 => State::WelfordC(r.f64s()?, r.complex()?, r.f64s()?),
            9 => State::Arg(r.reg()?, r.i64s()?, r.bools()?),
            _ => return Err(r.bad("an unknown state kind")),
        };
        if r.at != bytes.len() {
            return Err(r.bad("bytes after the state"));
        }
        Ok(Accumulator { func, state })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::eval::tiles::TileTarget;

    fn folded(func: ReduceFunc, values: Reg) -> Accumulator {
        let n = match &values {
            Reg::F(v) => v.len(),
            Reg::I(v) => v.len(),
            Reg::C(v) => v.len(),
            Reg::B(v) => v.len(),
            Reg::U(v) => v.len(),
        };
        let dtype = match &values {
            Reg::F(_) => DType::F64,
            Reg::I(_) => DType::I64,
            Reg::B(_) => DType::Bool,
            _ => DType::C128,
        };
        let mut acc = Accumulator::new(func, dtype, n).unwrap();
        let at = TileTarget {
            offset: 0,
            stride: 1,
            index: &[],
        };
        acc.fold(&values, n, at, (0, 1)).unwrap();
        acc
    }

    #[test]
    fn every_state_round_trips() {
        let f = Reg::F(vec![1.5, -2.0, f64::NAN, 4.25]);
        let cases = [
            (ReduceFunc::Sum, f.clone()),
            (ReduceFunc::Mean, f.clone()),
            (ReduceFunc::NanMean, f.clone()),
            (ReduceFunc::Var, f.clone()),
            (ReduceFunc::Max, f.clone()),
            (ReduceFunc::Argmin, f.clone()),
            (ReduceFunc::Any, Reg::B(vec![false, true, false])),
            (ReduceFunc::Sum, Reg::I(vec![3, -4, 5])),
            (
                ReduceFunc::Var,
                Reg::C(vec![Complex64::new(1.0, 2.0), Complex64::new(-3.0, 0.5)]),
            ),
        ];
        for (func, values) in cases {
            let acc = folded(func, values);
            let back = Accumulator::from_bytes(func, &acc.to_bytes()).unwrap();
            assert_eq!(back.to_bytes(), acc.to_bytes(), "{func:?}");
            let (a, b) = (
                acc.finish(DType::F64, 4, 0.0),
                back.finish(DType::F64, 4, 0.0),
            );
            match (a, b) {
                (Ok(a), Ok(b)) => assert_eq!(a.bytes(), b.bytes(), "{func:?}"),
                (a, b) => assert_eq!(a.is_err(), b.is_err(), "{func:?}"),
            }
        }
    }

    #[test]
    fn damaged_bytes_are_errors() {
        let acc = folded(ReduceFunc::Var, Reg::F(vec![1.0, 2.0]));
        let bytes = acc.to_bytes();
        for cut in [0, 3, 10, bytes.len() - 1] {
            let e = Accumulator::from_bytes(ReduceFunc::Var, &bytes[..cut]).unwrap_err();
            assert!(e.to_string().contains("partial reduction state"), "{e}");
        }
        let e = Accumulator::from_bytes(ReduceFunc::Sum, &bytes).unwrap_err();
        assert!(e.to_string().contains("state of var, not sum"), "{e}");
    }
}
