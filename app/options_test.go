package app

import (
	"reflect"
	"testing"
)

// A route that leaves an option unset takes the idempotency app's value of
// it, for every option but the store (the route shares the app's instance
// instead). Every field of Options is set here, by reflection, so that an
// option added to Options and not named in Inherit fails this test.
func TestInheritNamesEveryOption(t *testing.T) {
	var app Options
	set := reflect.ValueOf(&app).Elem()
	for i := range set.NumField() {
		switch f := set.Field(i); f.Kind() {
		case reflect.String:
			f.SetString("x")
		case reflect.Bool:
			f.SetBool(true)
		case reflect.Int, reflect.Int64:
			f.SetInt(7)
		case reflect.Slice:
			f.Set(reflect.MakeSlice(f.Type(), 1, 1))
		case reflect.Pointer:
			f.Set(reflect.New(f.Type().Elem()))
		default:
			t.Fatalf("Options.%s is a %s: teach this test to set it", set.Type().Field(i).Name, f.Kind())
		}
	}
	var route Options
	route.Inherit(&app)
	got := reflect.ValueOf(&route).Elem()
	for i := range set.NumField() {
		name := set.Type().Field(i).Name
		inherited := reflect.DeepEqual(got.Field(i).Interface(), set.Field(i).Interface())
		switch {
		case name == "StoreRaw" && !got.Field(i).IsZero():
			t.Errorf("the route inherited the app's store option; it shares the app's instance instead")
		case name != "StoreRaw" && !inherited:
			t.Errorf("Options.%s is not inherited: name it in Inherit", name)
		}
	}
	// A list is the route's own copy: SetDefaults changes Methods in place.
	route.Methods[0] = "POST"
	if app.Methods[0] != "" {
		t.Error("the route's methods are the app's list, not a copy")
	}
}
