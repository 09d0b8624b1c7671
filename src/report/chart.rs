//! Line charts of training curves: plotters draws the SVG, resvg renders that SVG to PNG, so
//! the two are the same picture. Text uses an embedded font (a subset of DejaVu Sans,
//! `assets/fonts/`) for both layout and rendering, so charts look the same on machines
//! without fonts.

use super::ReportError;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::FontStyle;
use std::path::Path;
use std::sync::OnceLock;

/// The embedded font's bytes.
const FONT: &[u8] = include_bytes!("../../assets/fonts/DejaVuSans-subset.ttf");

/// Picture size, pixels.
pub(super) const SIZE: (u32, u32) = (1000, 600);

/// Tableau 10: distinguishable, also for most colour-blind readers.
const PALETTE: [RGBColor; 10] = [
    RGBColor(78, 121, 167),
    RGBColor(242, 142, 43),
    RGBColor(225, 87, 89),
    RGBColor(118, 183, 178),
    RGBColor(89, 161, 79),
    RGBColor(237, 201, 72),
    RGBColor(176, 122, 161),
    RGBColor(255, 157, 167),
    RGBColor(156, 117, 95),
    RGBColor(186, 176, 172),
];

/// The palette's colour `i` (cycling), as SVG writes colours.
pub(super) fn colour(i: usize) -> String {
    let RGBColor(r, g, b) = PALETTE[i % PALETTE.len()];
    format!("#{r:02x}{g:02x}{b:02x}")
}

/// One run's curves of one quantity.
#[derive(Debug, Clone, PartialEq)]
pub struct Curves {
    /// Legend text.
    pub label: String,
    /// (step, value) during training.
    pub train: Vec<(f64, f64)>,
    /// (step, value) at evaluations.
    pub val: Vec<(f64, f64)>,
}

/// A chart: one quantity of one or more runs against the step.
#[derive(Debug, Clone, PartialEq)]
pub struct Chart {
    /// Title.
    pub title: String,
    /// What the y axis shows: `loss`, `accuracy`.
    pub quantity: String,
    /// Whether higher is better (accuracy: legend at the bottom, out of the curves' way).
    pub rising: bool,
    /// Every run.
    pub runs: Vec<Curves>,
}

/// Registers the embedded font as plotters' `sans-serif` once per process.
fn font() -> Result<(), ReportError> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| plotters::style::register_font("sans-serif", FontStyle::Normal, FONT).is_ok());
    if ok { Ok(()) } else { Err(ReportError::Draw("the embedded font does not load".into())) }
}

/// Draws `chart` to `svg` and `png`.
pub fn draw(chart: &Chart, svg: &Path, png: &Path) -> Result<(), ReportError> {
    font()?;
    let mut text = String::new();
    {
        let root = SVGBackend::with_string(&mut text, SIZE).into_drawing_area();
        plot(&root, chart)?;
        root.present().map_err(draw_error)?;
    }
    std::fs::write(svg, &text).map_err(|e| ReportError::io(svg, e))?;
    let bytes = rasterize(&text)?;
    std::fs::write(png, bytes).map_err(|e| ReportError::io(png, e))
}

/// The SVG as PNG bytes, twice the SVG's size so text stays crisp on dense screens.
pub(super) fn rasterize(svg: &str) -> Result<Vec<u8>, ReportError> {
    let mut options = resvg::usvg::Options::default();
    let fonts = options.fontdb_mut();
    fonts.load_font_data(FONT.to_vec());
    fonts.set_sans_serif_family("DejaVu Sans");
    let tree = resvg::usvg::Tree::from_str(svg, &options).map_err(|e| ReportError::Draw(e.to_string()))?;
    let scale = 2.0;
    let (w, h) = (SIZE.0 * 2, SIZE.1 * 2);
    let mut pixmap = resvg::tiny_skia::Pixmap::new(w, h).ok_or_else(|| ReportError::Draw("no picture".into()))?;
    pixmap.fill(resvg::tiny_skia::Color::WHITE);
    resvg::render(&tree, resvg::tiny_skia::Transform::from_scale(scale, scale), &mut pixmap.as_mut());
    pixmap.encode_png().map_err(|e| ReportError::Draw(e.to_string()))
}

fn draw_error<E: std::error::Error + Send + Sync>(e: DrawingAreaErrorKind<E>) -> ReportError {
    ReportError::Draw(e.to_string())
}

/// Axis ranges that hold every point, with a margin; accuracies stay within [0, 1].
fn ranges(chart: &Chart) -> (std::ops::Range<f64>, std::ops::Range<f64>) {
    let points = || chart.runs.iter().flat_map(|r| r.train.iter().chain(&r.val)).filter(|p| p.1.is_finite());
    let max_x = points().map(|p| p.0).fold(1.0f64, f64::max);
    let (lo, hi) = points().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), p| (lo.min(p.1), hi.max(p.1)));
    let (lo, hi) = if lo.is_finite() { (lo, hi) } else { (0.0, 1.0) };
    let pad = ((hi - lo) * 0.05).max(1e-3);
    let y = if chart.rising { (lo - pad).max(0.0)..(hi + pad).min(1.0) } else { (lo - pad).max(0.0)..hi + pad };
    // A little room past the last step, so its dots are not cut.
    (0.0..max_x * 1.02, y)
}

fn plot<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, chart: &Chart) -> Result<(), ReportError>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(draw_error)?;
    let (x, y) = ranges(chart);
    let mut c = ChartBuilder::on(root)
        .caption(&chart.title, ("sans-serif", 26).into_font())
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(x, y)
        .map_err(draw_error)?;
    c.configure_mesh()
        .x_desc("step")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_desc(chart.quantity.as_str())
        .axis_desc_style(("sans-serif", 18))
        .label_style(("sans-serif", 15))
        .light_line_style(TRANSPARENT)
        .bold_line_style(RGBColor(225, 225, 225))
        .draw()
        .map_err(draw_error)?;

    let single = chart.runs.len() == 1;
    for (i, run) in chart.runs.iter().enumerate() {
        // One run: training and validation in two colours. Several: one colour per run,
        // validation dashed with dots.
        let train_color = PALETTE[if single { 0 } else { i % PALETTE.len() }];
        let val_color = if single { PALETTE[1] } else { train_color };
        let line = train_color.stroke_width(2);
        let series = c.draw_series(LineSeries::new(run.train.iter().copied(), line)).map_err(draw_error)?;
        let label = if single { format!("training {}", chart.quantity) } else { run.label.clone() };
        series.label(label).legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], line));
        if run.val.is_empty() {
            continue;
        }
        let dashed = val_color.stroke_width(2);
        c.draw_series(DashedLineSeries::new(run.val.iter().copied(), 8, 5, dashed)).map_err(draw_error)?;
        let dots = c.draw_series(run.val.iter().map(|&p| Circle::new(p, 4, val_color.filled()))).map_err(draw_error)?;
        if single {
            dots.label(format!("validation {}", chart.quantity)).legend(move |(x, y)| {
                EmptyElement::at((x, y))
                    + PathElement::new(vec![(0, 0), (8, 0)], dashed)
                    + PathElement::new(vec![(16, 0), (24, 0)], dashed)
                    + Circle::new((12, 0), 4, val_color.filled())
            });
        }
    }
    if !single {
        // What the two line styles mean, in grey.
        let grey = RGBColor(110, 110, 110);
        c.draw_series(std::iter::empty::<Circle<(f64, f64), i32>>())
            .map_err(draw_error)?
            .label("solid: training")
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], grey.stroke_width(2)));
        c.draw_series(std::iter::empty::<Circle<(f64, f64), i32>>())
            .map_err(draw_error)?
            .label("dashed, dots: validation")
            .legend(move |(x, y)| {
                EmptyElement::at((x, y))
                    + PathElement::new(vec![(0, 0), (8, 0)], grey.stroke_width(2))
                    + PathElement::new(vec![(16, 0), (24, 0)], grey.stroke_width(2))
                    + Circle::new((12, 0), 4, grey.filled())
            });
    }
    let position = if chart.rising { SeriesLabelPosition::LowerRight } else { SeriesLabelPosition::UpperRight };
    c.configure_series_labels()
        .position(position)
        .background_style(WHITE.mix(0.9))
        .border_style(RGBColor(180, 180, 180))
        .label_font(("sans-serif", 15))
        .legend_area_size(32)
        .margin(12)
        .draw()
        .map_err(draw_error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_hold_every_point_and_accuracies_stay_in_bounds() {
        let chart = Chart {
            title: "t".into(),
            quantity: "accuracy".into(),
            rising: true,
            runs: vec![Curves { label: "a".into(), train: vec![(10.0, 0.2), (20.0, 0.99)], val: vec![(20.0, 0.5)] }],
        };
        let (x, y) = ranges(&chart);
        assert!(x.start == 0.0 && x.end > 20.0 && x.end < 21.0, "{x:?}");
        assert!(y.start <= 0.2 && y.start >= 0.0 && y.end <= 1.0 && y.end >= 0.99, "{y:?}");
        let empty = Chart { runs: vec![], ..chart };
        assert_eq!(ranges(&empty).1.end, 1.0);
    }
}
