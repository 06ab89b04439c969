//! Views: how a node's coordinates map to its input's (basic indexing, transposes,
//! broadcasting), per input axis.

use crate::array::Region;

/// How one input axis is addressed from output coordinates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ViewAxis {
    /// Always this index (integer indexing or a broadcast length-1 axis).
    Fixed(u64),
    /// `start + step * i` where `i` is the index on output axis `out_axis`.
    Mapped {
        /// The output axis.
        out_axis: usize,
        /// The input index of output index 0.
        start: u64,
        /// Stride, not 0; negative walks the input axis backwards.
        step: i64,
    },
}

/// `start + step * i`: the input index an output index `i` maps to (never negative for
/// indices a view maps).
fn offset(start: u64, step: i64, i: u64) -> u64 {
    (start as i64 + step * i as i64) as u64
}

/// Maps output coordinates to input coordinates, one entry per input axis.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct View {
    /// One entry per input axis.
    pub axes: Vec<ViewAxis>,
}

impl View {
    /// The identity view of rank `rank`.
    pub fn identity(rank: usize) -> Self {
        View {
            axes: (0..rank)
                .map(|d| ViewAxis::Mapped {
                    out_axis: d,
                    start: 0,
                    step: 1,
                })
                .collect(),
        }
    }

    /// True when this is the identity between arrays of rank `rank` (a view that also adds
    /// axes is not).
    pub fn is_identity(&self, rank: usize) -> bool {
        self.axes.len() == rank
            && self.axes.iter().enumerate().all(|(d, a)| {
                *a == ViewAxis::Mapped {
                    out_axis: d,
                    start: 0,
                    step: 1,
                }
            })
    }

    /// `self` maps middle → inner coordinates and `outer` maps outer → middle; the result maps
    /// outer → inner.
    pub fn compose(&self, outer: &View) -> View {
        View {
            axes: self
                .axes
                .iter()
                .map(|a| match *a {
                    ViewAxis::Fixed(i) => ViewAxis::Fixed(i),
                    ViewAxis::Mapped {
                        out_axis,
                        start,
                        step,
                    } => match outer.axes[out_axis] {
                        ViewAxis::Fixed(j) => ViewAxis::Fixed(offset(start, step, j)),
                        ViewAxis::Mapped {
                            out_axis: o,
                            start: s2,
                            step: st2,
                        } => ViewAxis::Mapped {
                            out_axis: o,
                            start: offset(start, step, s2),
                            step: step * st2,
                        },
                    },
                })
                .collect(),
        }
    }

    /// The box of input coordinates that `region` (output coordinates) reads: its bounding
    /// box, one entry per input axis.
    pub fn input_box(&self, region: &Region) -> Region {
        let (start, shape) = self
            .axes
            .iter()
            .map(|a| match *a {
                ViewAxis::Fixed(i) => (i, 1),
                ViewAxis::Mapped {
                    out_axis,
                    start,
                    step,
                } => {
                    let n = region.shape[out_axis];
                    let first = offset(start, step, region.start[out_axis]);
                    let span = match n {
                        0 => 0,
                        n => step.unsigned_abs() * (n - 1) + 1,
                    };
                    // Walking backwards, the box ends at the region's first index.
                    let low = match (step < 0, n) {
                        (true, 1..) => first + 1 - span,
                        _ => first,
                    };
                    (low, span)
                }
            })
            .unzip();
        Region { start, shape }
    }

    /// True when the view only shifts, fixes single indices and adds axes of length 1, in
    /// order: the values it selects from any box are that box's values in the same order,
    /// so a box of output coordinates and its input box (see [`input_box`](Self::input_box))
    /// hold the same values laid out alike. `out_shape` is the output's shape.
    pub fn is_box(&self, out_shape: &[u64]) -> bool {
        let mut last: Option<usize> = None;
        let mut mapped = vec![false; out_shape.len()];
        for a in &self.axes {
            if let ViewAxis::Mapped { out_axis, step, .. } = *a {
                if step != 1 || last.is_some_and(|l| out_axis <= l) || out_axis >= mapped.len() {
                    return false;
                }
                last = Some(out_axis);
                mapped[out_axis] = true;
            }
        }
        mapped.iter().zip(out_shape).all(|(&m, &n)| m || n == 1)
    }

    /// For a box view (see [`is_box`](Self::is_box)), the output box of rank `rank` whose
    /// input box is `input` (which lies on the view's fixed indices).
    pub fn output_box(&self, input: &Region, rank: usize) -> Region {
        let mut out = Region {
            start: vec![0; rank],
            shape: vec![1; rank],
        };
        for (j, a) in self.axes.iter().enumerate() {
            if let ViewAxis::Mapped {
                out_axis, start, ..
            } = *a
            {
                out.start[out_axis] = input.start[j] - start;
                out.shape[out_axis] = input.shape[j];
            }
        }
        out
    }

    /// The input axes the view walks backwards (negative steps).
    pub fn reversed_axes(&self) -> Vec<usize> {
        self.axes
            .iter()
            .enumerate()
            .filter(|(_, a)| matches!(a, ViewAxis::Mapped { step, .. } if *step < 0))
            .map(|(j, _)| j)
            .collect()
    }

    /// The view that broadcasts an input of `in_shape` to `out_shape` (numpy rules).
    pub fn broadcast(in_shape: &[u64], out_shape: &[u64]) -> View {
        let offset = out_shape.len() - in_shape.len();
        View {
            axes: in_shape
                .iter()
                .enumerate()
                .map(|(j, &n)| {
                    let o = offset + j;
                    if n == 1 && out_shape[o] != 1 {
                        ViewAxis::Fixed(0)
                    } else {
                        ViewAxis::Mapped {
                            out_axis: o,
                            start: 0,
                            step: 1,
                        }
                    }
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn box_views_map_boxes_both_ways() {
        // x[2, 1:, None] of a (4, 5) array: a fixed row, a crop, a new axis.
        let view = View {
            axes: vec![
                ViewAxis::Fixed(2),
                ViewAxis::Mapped {
                    out_axis: 0,
                    start: 1,
                    step: 1,
                },
            ],
        };
        assert!(view.is_box(&[4, 1]));
        assert!(!view.is_box(&[4, 3]), "a new axis longer than 1 broadcasts");
        let out = Region {
            start: vec![1, 0],
            shape: vec![2, 1],
        };
        let input = view.input_box(&out);
        assert_eq!(input.start, vec![2, 2]);
        assert_eq!(input.shape, vec![1, 2]);
        assert_eq!(view.output_box(&input, 2), out);
        let strided = View {
            axes: vec![ViewAxis::Mapped {
                out_axis: 0,
                start: 0,
                step: 2,
            }],
        };
        assert!(!strided.is_box(&[3]));
        let swapped = View {
            axes: vec![
                ViewAxis::Mapped {
                    out_axis: 1,
                    start: 0,
                    step: 1,
                },
                ViewAxis::Mapped {
                    out_axis: 0,
                    start: 0,
                    step: 1,
                },
            ],
        };
        assert!(!swapped.is_box(&[3, 3]), "a transpose reorders values");
    }

    #[test]
    fn views_compose() {
        // x[2:10:2] then [1:3] == x[4:8:2]
        let inner = View {
            axes: vec![ViewAxis::Mapped {
                out_axis: 0,
                start: 2,
                step: 2,
            }],
        };
        let outer = View {
            axes: vec![ViewAxis::Mapped {
                out_axis: 0,
                start: 1,
                step: 1,
            }],
        };
        assert_eq!(
            inner.compose(&outer).axes,
            vec![ViewAxis::Mapped {
                out_axis: 0,
                start: 4,
                step: 2
            }]
        );
    }

    #[test]
    fn backward_views_compose_and_bound_their_boxes() {
        let mapped = |start, step| ViewAxis::Mapped {
            out_axis: 0,
            start,
            step,
        };
        // x[::-1] (n = 10) then [2:5] == x[7:4:-1]; then [::-2] of that == x[5:8:2].
        let reverse = View {
            axes: vec![mapped(9, -1)],
        };
        let crop = View {
            axes: vec![mapped(2, 1)],
        };
        let both = reverse.compose(&crop);
        assert_eq!(both.axes, vec![mapped(7, -1)]);
        let back = View {
            axes: vec![mapped(2, -2)],
        };
        assert_eq!(both.compose(&back).axes, vec![mapped(5, 2)]);
        assert_eq!(both.reversed_axes(), vec![0]);
        assert!(both.compose(&back).reversed_axes().is_empty());
        assert!(!both.is_box(&[3]));
        // Output [1, 3) of x[9::-3] reads x[3], x[6]: the box [3, 7).
        let region = Region {
            start: vec![1],
            shape: vec![2],
        };
        let strided = View {
            axes: vec![mapped(9, -3)],
        };
        let b = strided.input_box(&region);
        assert_eq!((b.start, b.shape), (vec![3], vec![4]));
    }
}
