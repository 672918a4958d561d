// sqlx::migrate! embeds migrations/{sqlite,postgres} at compile time; rebuild when they change.
fn main() {
    println!("cargo:rerun-if-changed=../../migrations");
}
