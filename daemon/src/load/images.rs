//! Synthetic images for vision models (`--images-per-request K --image-size WxH
//! --image-format png`, as vLLM's `random-mm` and GuideLLM's and AIPerf's synthetic images):
//! deterministic W×H RGB images, distinct per request and image (drawn from the seed, the
//! request index and the image's place), encoded and sent as OpenAI `image_url` parts with
//! `data:` URLs. An image is a grid of 16×16-pixel blocks of seeded colours: every request's
//! images differ (no server-side image cache hit), and they stay small once encoded.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

/// Encoding of the synthetic images.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ImageFormat {
    Png,
}

impl ImageFormat {
    /// The MIME type of the `data:` URL.
    pub fn mime(self) -> &'static str {
        match self {
            Self::Png => "image/png",
        }
    }
}

/// Largest width or height accepted, pixels.
pub const MAX_SIDE: u32 = 8192;
/// Side of the colour blocks, pixels.
const BLOCK: u32 = 16;
const IMAGE_STREAM: u64 = 0x1D8E_4E27_C47D_124F;

/// The images each request carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SyntheticImages {
    pub per_request: u32,
    pub width: u32,
    pub height: u32,
    pub format: ImageFormat,
}

/// One encoded image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodedImage {
    /// `data:image/png;base64,…`.
    pub data_url: String,
    /// Encoded size (before base64), bytes.
    pub bytes: usize,
}

impl SyntheticImages {
    /// Validates `--images-per-request`, `--image-size WxH` and `--image-format`; errors name
    /// the flag and value.
    pub fn new(per_request: u32, size: &str, format: &str) -> Result<Self, String> {
        if per_request == 0 {
            return Err("--images-per-request 0: at least 1 (or leave the flag out)".into());
        }
        let (width, height) = parse_size(size)?;
        let format = match format.to_ascii_lowercase().as_str() {
            "png" => ImageFormat::Png,
            f => return Err(format!("--image-format {f:?}: png")),
        };
        Ok(Self {
            per_request,
            width,
            height,
            format,
        })
    }

    /// `WxH`, as the summary and the rows name the size.
    pub fn size_label(&self) -> String {
        format!("{}x{}", self.width, self.height)
    }

    /// Image `k` of request `i`, from `seed`.
    ///
    /// # Errors
    /// The encoder's (not expected for a valid size).
    pub fn image(&self, seed: u64, i: usize, k: u32) -> Result<EncodedImage, String> {
        let mut rng = SmallRng::seed_from_u64(
            seed ^ IMAGE_STREAM
                ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
                ^ u64::from(k).wrapping_mul(0xC2B2_AE3D_27D4_EB4F),
        );
        let (w, h) = (self.width as usize, self.height as usize);
        let cols = self.width.div_ceil(BLOCK) as usize;
        let rows = self.height.div_ceil(BLOCK) as usize;
        let colours: Vec<[u8; 3]> = (0..cols * rows).map(|_| rng.random()).collect();
        let mut pixels = Vec::with_capacity(w * h * 3);
        for y in 0..h {
            let row = y / BLOCK as usize;
            for x in 0..w {
                let c = colours[row * cols + x / BLOCK as usize];
                pixels.extend_from_slice(&c);
            }
        }
        let bytes = match self.format {
            ImageFormat::Png => encode_png(self.width, self.height, &pixels)?,
        };
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD.encode(&bytes);
        Ok(EncodedImage {
            data_url: format!("data:{};base64,{b64}", self.format.mime()),
            bytes: bytes.len(),
        })
    }
}

fn encode_png(width: u32, height: u32, rgb: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    let mut enc = png::Encoder::new(&mut out, width, height);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let mut w = enc.write_header().map_err(|e| format!("png: {e}"))?;
    w.write_image_data(rgb).map_err(|e| format!("png: {e}"))?;
    w.finish().map_err(|e| format!("png: {e}"))?;
    Ok(out)
}

/// Parses `WxH` (e.g. `512x512`), each side in `1..=MAX_SIDE` pixels.
pub fn parse_size(text: &str) -> Result<(u32, u32), String> {
    let bad = || format!("--image-size {text:?}: WIDTHxHEIGHT in pixels, each 1..={MAX_SIDE}");
    let (w, h) = text.trim().split_once(['x', 'X']).ok_or_else(bad)?;
    let side = |s: &str| {
        s.trim()
            .parse::<u32>()
            .ok()
            .filter(|v| (1..=MAX_SIDE).contains(v))
            .ok_or_else(bad)
    };
    Ok((side(w)?, side(h)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_decode_to_their_size_and_differ_per_request() {
        let s = SyntheticImages::new(2, "40x24", "png").unwrap();
        let a = s.image(7, 0, 0).unwrap();
        assert!(a.data_url.starts_with("data:image/png;base64,"));
        use base64::Engine as _;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(&a.data_url["data:image/png;base64,".len()..])
            .unwrap();
        assert_eq!(bytes.len(), a.bytes);
        let info = png::Decoder::new(std::io::Cursor::new(bytes))
            .read_info()
            .unwrap();
        assert_eq!((info.info().width, info.info().height), (40, 24));
        assert_eq!(s.image(7, 0, 0).unwrap(), a, "deterministic");
        assert_ne!(s.image(7, 0, 1).unwrap(), a);
        assert_ne!(s.image(7, 1, 0).unwrap(), a);
        assert_ne!(s.image(8, 0, 0).unwrap(), a);
        assert_eq!(s.size_label(), "40x24");
    }

    #[test]
    fn bad_flags_name_the_flag() {
        assert!(parse_size("512").unwrap_err().contains("--image-size"));
        assert!(parse_size("0x5").is_err());
        assert!(parse_size("9000x5").is_err());
        assert_eq!(parse_size("640X480"), Ok((640, 480)));
        assert!(
            SyntheticImages::new(0, "8x8", "png")
                .unwrap_err()
                .contains("--images-per-request")
        );
        assert!(
            SyntheticImages::new(1, "8x8", "gif")
                .unwrap_err()
                .contains("--image-format")
        );
    }
}
