//! Image folders of PNG and JPEG files written with the `image` crate, read back; and the
//! refusals: empty class, no classes, corrupt image, splits with other classes.

use super::*;
use crate::data::formats::read_one as read;
use image::{GrayImage, RgbImage};

fn options(height: usize, width: usize, color_mode: ColorMode) -> ImageFolderOptions {
    let size = |n| NonZeroUsize::new(n).unwrap();
    ImageFolderOptions { image_size: (size(height), size(width)), color_mode, cache: false }
}

/// An RGB image whose pixel (y, x) is (10y + x, 100 + seed, 200 - x).
fn rgb(width: u32, height: u32, seed: u8) -> RgbImage {
    RgbImage::from_fn(width, height, |x, y| image::Rgb([(10 * y + x) as u8, 100 + seed, 200 - x as u8]))
}

fn folder() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let train = dir.path().join("train");
    for class in ["dog", "cat", ".hidden"] {
        std::fs::create_dir_all(train.join(class)).unwrap();
    }
    rgb(4, 3, 1).save(train.join("cat/b.png")).unwrap();
    rgb(4, 3, 2).save(train.join("cat/a.PNG")).unwrap();
    std::fs::write(train.join("cat/notes.txt"), "not an image").unwrap();
    std::fs::create_dir_all(train.join("dog/sub")).unwrap();
    GrayImage::from_fn(4, 3, |x, y| image::Luma([(x * 50 + y) as u8])).save(train.join("dog/sub/c.png")).unwrap();
    rgb(4, 3, 3).save(train.join("dog/z.jpg")).unwrap();
    dir
}

#[test]
fn classes_are_sorted_folders_and_images_are_listed_class_by_class() {
    let dir = folder();
    let data = ImageFolder::open(&dir.path().join("train"), options(3, 4, ColorMode::Rgb)).unwrap();
    assert_eq!(data.classes().names(), ["cat", "dog"]);
    let names: Vec<String> =
        data.files().iter().map(|f| f.strip_prefix(dir.path()).unwrap().display().to_string()).collect();
    assert_eq!(names, ["train/cat/a.PNG", "train/cat/b.png", "train/dog/z.jpg", "train/dog/sub/c.png"]);
    assert_eq!((0..4).map(|i| data.labels().class(i).unwrap()).collect::<Vec<_>>(), [0, 0, 1, 1]);
    assert_eq!((data.shape(), data.dtype()), (&[3, 4, 3][..], Dtype::U8));
    // PNG is lossless: values are the raw 0..=255 bytes.
    let a = read(&data, 0);
    assert_eq!(&a[..6], [0.0, 102.0, 200.0, 1.0, 102.0, 199.0]);
    assert_eq!(a[3 * (4 + 2)], 12.0);
    // A grayscale PNG read as RGB repeats its value.
    assert_eq!(&read(&data, 3)[3..6], [50.0, 50.0, 50.0]);
    // JPEG is lossy: close, not equal.
    let jpeg = read(&data, 2);
    let reference = rgb(4, 3, 3).into_raw();
    let worst = jpeg.iter().zip(&reference).map(|(&j, &r)| (j - f32::from(r)).abs()).fold(0.0, f32::max);
    assert!(worst < 24.0, "{worst}");
}

#[test]
fn images_are_resized_bilinearly_and_converted_to_grayscale() {
    let dir = folder();
    let train = dir.path().join("train");
    let data = ImageFolder::open(&train, options(6, 8, ColorMode::Grayscale)).unwrap();
    assert_eq!(data.shape(), [6, 8, 1]);
    let big = read(&data, 3);
    // Doubling the 4×3 gray image: the first row blends columns as TensorFlow does.
    assert_eq!(&big[..4], [0.0, 12.5, 37.5, 62.5]);
    let rgb_as_gray = read(&ImageFolder::open(&train, options(3, 4, ColorMode::Grayscale)).unwrap(), 0);
    let expected = image::DynamicImage::ImageRgb8(rgb(4, 3, 2)).into_luma8().into_raw();
    assert_eq!(rgb_as_gray, expected.iter().map(|&v| f32::from(v)).collect::<Vec<_>>());
}

#[test]
fn parallel_and_cached_reads_match_single_reads() {
    let dir = folder();
    let train = dir.path().join("train");
    let plain = ImageFolder::open(&train, options(3, 4, ColorMode::Rgb)).unwrap();
    let cached =
        ImageFolder::open(&train, ImageFolderOptions { cache: true, ..options(3, 4, ColorMode::Rgb) }).unwrap();
    let indices = [3, 0, 2, 1, 0];
    let mut many = vec![0.0; indices.len() * plain.example_len()];
    for _ in 0..2 {
        cached.read_many(&indices, &mut many).unwrap();
        for (slot, &i) in many.chunks(plain.example_len()).zip(&indices) {
            assert_eq!(slot, read(&plain, i));
        }
    }
    // The cache answers even once the file is gone.
    std::fs::remove_file(&cached.files()[0]).unwrap();
    assert_eq!(read(&cached, 0), read(&cached, 0));
    assert!(matches!(plain.read(0, &mut [0.0; 36]), Err(DataError::Read { .. })));
}

#[test]
fn bad_folders_and_images_are_refused_naming_the_path() {
    let dir = folder();
    let train = dir.path().join("train");
    let opts = options(3, 4, ColorMode::Rgb);
    std::fs::create_dir(train.join("empty")).unwrap();
    std::fs::write(train.join("empty/readme.txt"), "").unwrap();
    let err = ImageFolder::open(&train, opts).unwrap_err().to_string();
    assert_eq!(
        err,
        format!(
            "{}: the class folder holds no .png, .jpg or .jpeg image; add images or remove it",
            train.join("empty").display()
        )
    );
    std::fs::remove_dir_all(train.join("empty")).unwrap();

    let bare = dir.path().join("bare");
    std::fs::create_dir(&bare).unwrap();
    assert!(matches!(ImageFolder::open(&bare, opts), Err(DataError::NoClasses { .. })));
    assert!(matches!(ImageFolder::open(&dir.path().join("absent"), opts), Err(DataError::Read { .. })));

    let corrupt = train.join("cat/c.png");
    let mut bytes = std::fs::read(train.join("cat/a.PNG")).unwrap();
    bytes.truncate(bytes.len() / 2);
    std::fs::write(&corrupt, bytes).unwrap();
    let data = ImageFolder::open(&train, opts).unwrap();
    let at = data.files().iter().position(|f| f == &corrupt).unwrap();
    let err = data.read(at, &mut vec![0.0; data.example_len()]).unwrap_err().to_string();
    assert!(err.starts_with(&format!("cannot decode the image {}: ", corrupt.display())), "{err}");
    let all: Vec<usize> = (0..data.len()).collect();
    let err = data.read_many(&all, &mut vec![0.0; all.len() * data.example_len()]).unwrap_err();
    assert!(matches!(err, DataError::Image { path, .. } if path == corrupt));

    let test = dir.path().join("test");
    for class in ["cat", "bird"] {
        std::fs::create_dir_all(test.join(class)).unwrap();
        rgb(4, 3, 0).save(test.join(class).join("x.png")).unwrap();
    }
    let test = ImageFolder::open(&test, opts).unwrap();
    let err = data.check_same_classes(&test).unwrap_err().to_string();
    assert!(
        err.ends_with("must have the same class folders; only in the first: [dog], only in the second: [bird]"),
        "{err}"
    );
    assert!(data.check_same_classes(&data).is_ok());
}
