//! The PNG chart: one panel per workload phase, one bar per system (the
//! median, with a whisker from min to max), each panel in its own unit.

use std::path::Path;

use anyhow::{Context, Result, anyhow};
use plotters::coord::ranged1d::SegmentValue;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::{FontStyle, register_font};

use crate::report::{Grouped, Sample};

/// TTF files tried for the text, in order (Debian's fonts-dejavu-core first).
const FONTS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/truetype/freefont/FreeSans.ttf",
];

/// Registers a TTF font as "sans-serif" (ab_glyph has no font of its own).
fn load_font() -> Result<()> {
    let path = FONTS
        .iter()
        .find(|p| Path::new(p).exists())
        .ok_or_else(|| anyhow!("no TTF font found (apt-get install fonts-dejavu-core); tried {FONTS:?}"))?;
    let bytes: &'static [u8] = Box::leak(std::fs::read(path).with_context(|| path.to_string())?.into_boxed_slice());
    register_font("sans-serif", FontStyle::Normal, bytes).map_err(|_| anyhow!("{path}: not a usable TTF font"))?;
    Ok(())
}

/// Draws `samples` of the columns `systems` into the PNG `path`.
pub fn draw(samples: &[Sample], systems: &[String], title: &str, path: &Path) -> Result<()> {
    let g = Grouped::new(samples, systems);
    if g.labels.is_empty() {
        return Err(anyhow!("no results to chart"));
    }
    load_font()?;
    let n = g.labels.len();
    let cols = n.clamp(1, 4);
    let rows = n.div_ceil(cols);
    let panel_w = (120 + 60 * systems.len() as u32).clamp(360, 720);
    let panel_h = if systems.len() > 4 { 480 } else { 330 };
    let (w, h) = (panel_w * cols as u32, panel_h * rows as u32 + 50);
    let full = BitMapBackend::new(path, (w, h)).into_drawing_area();
    full.fill(&WHITE)?;
    let root = full.titled(title, ("sans-serif", 24))?;
    let panels = root.split_evenly((rows, cols));
    let nsys = systems.len() as i32;
    // Many columns: their names turned a quarter, or they would overlap.
    let many = systems.len() > 4;
    for (li, ((label, unit, _), area)) in g.labels.iter().zip(panels.iter()).enumerate() {
        let rates: Vec<_> = systems.iter().map(|s| g.rate(li, s)).collect();
        let top = rates.iter().flatten().map(|s| s.max).fold(0.0f64, f64::max);
        let top = if top > 0.0 { top * 1.15 } else { 1.0 };
        let mut chart = ChartBuilder::on(area)
            .caption(format!("{label} ({unit})"), ("sans-serif", 16))
            .margin(8)
            .x_label_area_size(if many { 185 } else { 30 })
            .y_label_area_size(55)
            .build_cartesian_2d((0..nsys - 1).into_segmented(), 0f64..top)?;
        let names = systems.to_vec();
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(systems.len())
            .x_label_style(("sans-serif", 13))
            .x_label_formatter(&|v| match v {
                SegmentValue::CenterOf(i) | SegmentValue::Exact(i) if !many => {
                    names.get(*i as usize).cloned().unwrap_or_default()
                }
                _ => String::new(),
            })
            .y_label_style(("sans-serif", 12))
            .y_label_formatter(&|v| crate::report::num(*v))
            .draw()?;
        if many {
            for (i, name) in systems.iter().enumerate() {
                let (x, y) = chart.backend_coord(&(SegmentValue::CenterOf(i as i32), 0.0));
                let style = ("sans-serif", 12).into_font().transform(FontTransform::Rotate90).color(&BLACK);
                full.draw(&Text::new(name.clone(), (x + 6, y + 8), style))?;
            }
        }
        for (i, r) in rates.iter().enumerate() {
            let Some(r) = r else { continue };
            let color = Palette99::pick(i).to_rgba();
            let i = i as i32;
            let mut bar =
                Rectangle::new([(SegmentValue::Exact(i), 0.0), (SegmentValue::Exact(i + 1), r.median)], color.filled());
            bar.set_margin(0, 0, 6, 6);
            chart.draw_series(std::iter::once(bar))?;
            chart.draw_series(std::iter::once(Text::new(
                crate::report::num(r.median),
                (SegmentValue::CenterOf(i), r.max.max(r.median) + top * 0.01),
                ("sans-serif", 12).into_font().color(&BLACK).pos(Pos::new(HPos::Center, VPos::Bottom)),
            )))?;
            if r.n > 1 {
                chart.draw_series(std::iter::once(PathElement::new(
                    vec![(SegmentValue::CenterOf(i), r.min), (SegmentValue::CenterOf(i), r.max)],
                    BLACK.stroke_width(2),
                )))?;
            }
        }
    }
    root.present().with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_a_png() {
        if load_font().is_err() {
            eprintln!("no font: skipped");
            return;
        }
        let mk = |system: &str, label: &str, value: f64| Sample {
            round: 1,
            system: system.into(),
            label: label.into(),
            unit: "files/s".into(),
            value,
            cpu: None,
            cpu_client_s: 0.0,
            cpu_bricks_s: 0.0,
            fops: Default::default(),
        };
        let samples = vec![mk("xlfs", "create n=10", 10.0), mk("ext4", "create n=10", 30.0), mk("xlfs", "stat", 5.0)];
        let dir = std::env::temp_dir().join(format!("xlfs-bench-chart-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let png = dir.join("c.png");
        draw(&samples, &["xlfs".into(), "ext4".into()], "t", &png).expect("draw");
        let head = std::fs::read(&png).expect("png");
        assert_eq!(&head[1..4], b"PNG");
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
